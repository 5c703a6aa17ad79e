"""tf.data service's servers: ``DispatchServer`` and ``WorkerServer``, run in this process.

Each is Sluice's Rust server on the module's own threads; it serves from construction until
:meth:`stop` (or the process exits), and works as a context manager::

    >>> import sluice
    >>> with sluice.DispatchServer() as dispatcher:
    ...     with sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target)) as worker:
    ...         ds = sluice.data.Dataset.range(3).apply(
    ...             sluice.distribute("parallel_epochs", dispatcher.target))
    ...         sorted(int(x) for x in ds)
    [0, 1, 2]
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from sluice import _native
from sluice.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    OpError,
    server_start_error,
)

__all__ = ["DispatcherConfig", "DispatchServer", "WorkerConfig", "WorkerServer"]

Peers = Union[Sequence[str], Mapping[int, str]]


@dataclasses.dataclass
class DispatcherConfig:
    """A dispatcher replica's settings (tf.data's names where it has them).

    - ``port``: the client API's port (clients and workers); 0 picks a free port.
    - ``peer_listen``: ``"host:port"`` of the Raft peer listener, which serves the other
      replicas only; ``None`` is this replica's own entry in ``peers``, else a free port.
    - ``work_dir``: the journal's directory; ``None`` uses a temporary one, removed on stop.
      As tf.data's, a missing or empty one gets a new journal, and a replica restarts from
      the journal it finds there (a journal of another node id is refused).
    - ``node_id``, ``peers``: the replica's Raft id and every replica's peer address, the same
      on every replica: a list (ids 1, 2, ...) or a dict ``{id: "host:port"}``. ``None`` is a
      one-node quorum. Each replica records its own client address once it runs.
    - ``join``: start with an empty journal and wait to be added to a running quorum with
      :func:`sluice.add_node` at its :attr:`DispatchServer.peer_address`, instead of creating
      one (no ``peers`` needed; port 0 works).
    - ``worker_addresses``: the fixed worker list of static sharding.
    - ``worker_timeout_ms``, ``client_timeout_ms``, ``job_gc_timeout_ms`` (negative: never).
    - ``gc_dynamic_sharding_jobs``: also collect ``distributed_epoch`` jobs that no client has
      used for ``job_gc_timeout_ms`` (tf.data's option of that name). Off by default, as in
      tf.data: such a job keeps its place, so a reader that comes back continues it.
    - ``max_definition_size``: the largest dataset definition a registration may carry, in
      bytes (``None``: 16 MiB), the same on every replica; larger ones are refused with
      ``InvalidArgumentError``. Keep large constant data in files.
    - ``max_pipeline_ops``, ``max_pipeline_depth``: the most ops a dataset definition may have
      (``None``: 10,000) and how deep tuples and dicts may nest in it (``None``: 64), as
      ``sluice dispatcher --max-pipeline-ops``/``--max-pipeline-depth``; larger ones are
      refused with ``InvalidArgumentError`` naming the count and the limit.
    - ``data_roots``: the only directories ``files()`` datasets may name (each must exist),
      or object-store URL prefixes (``"s3://bucket/prefix"``) they may name objects below.
      ``None`` or empty refuses every ``files()`` dataset: the safe default, since the paths
      come from whoever can reach the dispatcher. Symlinks are resolved before the check.
    - ``object_store_config``: a JSON file of per-store settings (endpoint, region,
      credentials, client options by ``"s3://bucket"`` or ``"s3://"``), for listing patterns
      at registration, as ``sluice dispatcher --object-store-config``; see docs/guide.md.
      Its values override the environment's and are never shown in logs, status or errors.
    - ``tls_cert``, ``tls_key``: the replica's certificate and key (PEM); with them both its
      listeners speak TLS. ``tls_ca``: the CA that callers' client certificates (and, on the
      peer listener, the other replicas', which must present one) are verified against.
      ``auth_token_file``: the tokens callers present (``ROLE NAME TOKEN`` lines; its ``peer``
      line is what this replica presents to the others), or ``SLUICE_AUTH_TOKEN``. See
      ``sluice certs`` and docs/security.md.
    - ``insecure``: serve beyond loopback without TLS and authentication; without it a replica
      whose ``host`` is not a loopback address refuses to start unprotected.
    - ``protocol`` must be ``"grpc"``; ``fault_tolerant_mode`` is always on (Raft journal), and
      ``job_gc_check_interval_ms`` is accepted for tf.data's sake.
    """

    port: int = 0
    protocol: str = "grpc"
    work_dir: Optional[str] = None
    fault_tolerant_mode: bool = True
    node_id: int = 1
    peers: Optional[Peers] = None
    worker_addresses: Optional[List[str]] = None
    job_gc_check_interval_ms: Optional[int] = None
    job_gc_timeout_ms: Optional[int] = None
    worker_timeout_ms: Optional[int] = None
    client_timeout_ms: Optional[int] = None
    max_definition_size: Optional[int] = None
    max_pipeline_ops: Optional[int] = None
    max_pipeline_depth: Optional[int] = None
    gc_dynamic_sharding_jobs: bool = False
    host: str = "127.0.0.1"
    join: bool = False
    data_roots: Optional[List[str]] = None
    peer_listen: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca: Optional[str] = None
    auth_token_file: Optional[str] = None
    insecure: bool = False
    object_store_config: Optional[str] = None


@dataclasses.dataclass
class WorkerConfig:
    """A worker's settings (tf.data's names).

    - ``dispatcher_address``: the dispatcher in any form ``service`` takes (``target``, or
      several replicas comma-separated).
    - ``port``: 0 picks a free port. ``worker_tags``: e.g. ``["COLOCATED"]``.
    - ``heartbeat_interval_ms``: how long a heartbeat may wait for news.
    - ``tls_cert``, ``tls_key``: the worker's certificate and key (PEM); with them its port
      (gRPC and raw fetch streams) speaks TLS. ``tls_ca``: the CA that readers' client
      certificates and the dispatcher's certificate are verified against.
      ``auth_token_file``: the tokens readers must present (``ROLE NAME TOKEN`` lines; its
      ``worker`` line is what the worker presents to the dispatcher), or
      ``SLUICE_AUTH_TOKEN``. See ``sluice certs`` and docs/security.md.
    - ``insecure``: serve beyond loopback without TLS and authentication; without it a worker
      whose ``host`` is not a loopback address refuses to start unprotected.

    - ``data_roots``: the only directories tasks may read files below, or object-store URL
      prefixes (``"s3://bucket/prefix"``) they may read objects below, checked again before
      each file is opened (whatever the dispatcher allowed). ``None`` or empty refuses every
      file. For example::

        >>> import pathlib, tempfile, sluice
        >>> with tempfile.TemporaryDirectory() as root:
        ...     _ = (pathlib.Path(root) / "a.txt").write_text("one\\ntwo\\n")
        ...     d = sluice.DispatchServer(sluice.DispatcherConfig(data_roots=[root]))
        ...     w = sluice.WorkerServer(sluice.WorkerConfig(d.target, data_roots=[root]))
        ...     ds = sluice.data.TextLineDataset(root + "/a.txt").apply(
        ...         sluice.distribute("parallel_epochs", d.target))
        ...     lines = list(ds)
        ...     w.stop(); d.stop()
        >>> lines
        [b'one', b'two']

    - ``object_store_config``: a JSON file of per-store settings (endpoint, region,
      credentials, client options by ``"s3://bucket"`` or ``"s3://"``), as ``sluice worker
      --object-store-config``; see docs/guide.md. Its values override the environment's and
      are never shown in logs, status or errors.

    - ``python_executors``: how many Python executor processes run the Python functions of
      pipelines (``Dataset.map`` of a callable before ``distribute``), with this process's own
      interpreter (``sys.executable``). ``None``: one per core; ``0``: none, and pipelines
      with Python functions are refused. Their code runs in this worker's executors: serve
      only trusted clients.

    - ``worker_address``: the address the worker registers under and clients dial, as
      tf.data's: ``%port%`` stands for the bound port (``"worker-3.example.com:%port%"``).
      ``None``: the bound address, which must then not be unspecified: a worker whose
      ``host`` is ``"0.0.0.0"`` or ``"::"`` needs one.
    - ``memory_budget_bytes``: what the buffers of all the worker's tasks may hold together
      (batches being built, shuffle buffers, prefetch queues, cross-trainer caches), as
      ``sluice worker --memory-budget``; an op past it fails its task with
      ``ResourceExhaustedError``. ``None``: half the machine's memory.
    - ``memory_reserve_bytes``: the part of the budget that only a task within its fair share
      (the budget less the reserve, divided among the tasks holding memory) may take, so that
      one job's buffers cannot fail another's small ones, as ``sluice worker
      --memory-reserve``. ``None``: an eighth of the budget.
    - ``max_pipeline_ops``, ``max_pipeline_depth``: the limits this worker checks again before
      it builds a task's pipeline (``None``: 10,000 ops, 64 levels), as ``sluice worker
      --max-pipeline-ops``/``--max-pipeline-depth``; a task over them fails naming the limit.
    - ``cross_trainer_cache_size_bytes``: what each task of a job read through a
      ``CrossTrainerCache`` may keep for its trainers, as tf.data's and ``sluice worker
      --cross-trainer-cache-size``; the oldest elements go first, so a trainer that falls behind
      skips them. ``None``: 10 GiB, or half the memory budget if that is less.
    - ``compress_local_readers``: compress the elements of datasets distributed with
      ``compression="AUTO"`` for readers on this machine too, as ``sluice worker
      --compress-local-readers``. By default a task's elements are compressed once a reader
      from another machine reads it; set this when readers reach the worker through a local
      proxy (a service mesh's sidecar, an SSH tunnel), so they look local and are not.
    - ``shared_memory``: readers on this machine, of this user, read large elements from a
      shared memory region of their stream rather than over the socket (``False``: as ``sluice
      worker --no-shared-memory``, the socket only).

    Readers in other processes present ``SLUICE_TLS_CA`` and ``SLUICE_AUTH_TOKEN`` (or
    ``SLUICE_AUTH_TOKEN_FILE``) from their environment.
    """

    dispatcher_address: str
    worker_address: Optional[str] = None
    port: int = 0
    protocol: str = "grpc"
    heartbeat_interval_ms: Optional[int] = None
    dispatcher_timeout_ms: Optional[int] = None
    worker_tags: Optional[List[str]] = None
    host: str = "127.0.0.1"
    data_roots: Optional[List[str]] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca: Optional[str] = None
    auth_token_file: Optional[str] = None
    insecure: bool = False
    python_executors: Optional[int] = None
    memory_budget_bytes: Optional[int] = None
    memory_reserve_bytes: Optional[int] = None
    max_pipeline_ops: Optional[int] = None
    max_pipeline_depth: Optional[int] = None
    cross_trainer_cache_size_bytes: Optional[int] = None
    object_store_config: Optional[str] = None
    compress_local_readers: bool = False
    shared_memory: bool = True


class _Server:
    """What both servers share: start, stop, join, the context manager."""

    _native: Optional[object]
    _config: Union["DispatcherConfig", "WorkerConfig"]

    def start(self) -> None:
        """Starts serving; a no-op once started. A dispatcher of a one-node quorum returns once
        it leads; a worker, once it has registered with the dispatcher."""
        if self._native is not None:
            return
        _check_protocol(self._config.protocol)
        try:
            self._native = self._launch()
        except OpError as e:
            raise server_start_error(e) from None

    def _launch(self) -> object:
        """The native server for ``self._config``, serving."""
        raise NotImplementedError

    def join(self) -> None:
        """Blocks until the server stops (Ctrl-C interrupts the wait)."""
        self._running().join()

    def stop(self) -> None:
        """Stops the server at once, as a crash would for its peers; idempotent."""
        if self._native is not None:
            self._native.stop()  # type: ignore[attr-defined]

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _running(self):  # type: ignore[no-untyped-def]
        if self._native is None:
            raise FailedPreconditionError("the server has not been started")
        return self._native

    @property
    def _address(self) -> str:
        """``host:port`` the server serves on."""
        return str(self._running().address)


class DispatchServer(_Server):
    """A dispatcher replica serving in this process.

    ``target`` is its address for clients and workers, ``"grpc://host:port"``;
    ``peer_address`` is its Raft peer listener's, for the other replicas. With ``start=False``
    it starts at :meth:`start`.
    """

    def __init__(self, config: Optional[DispatcherConfig] = None, start: bool = True) -> None:
        self._config = config or DispatcherConfig()
        self._native: Optional[_native.DispatchServer] = None
        if start:
            self.start()

    def _launch(self) -> _native.DispatchServer:
        c = self._config
        return _native.DispatchServer(
            c.host,
            int(c.port),
            None if c.work_dir is None else str(c.work_dir),
            int(c.node_id),
            _peers(c.peers),
            list(c.worker_addresses or []),
            worker_timeout_ms=c.worker_timeout_ms,
            client_timeout_ms=c.client_timeout_ms,
            job_gc_timeout_ms=c.job_gc_timeout_ms,
            join=bool(c.join),
            data_roots=[str(r) for r in c.data_roots or []],
            peer_listen=None if c.peer_listen is None else str(c.peer_listen),
            tls_cert=_path(c.tls_cert),
            tls_key=_path(c.tls_key),
            tls_ca=_path(c.tls_ca),
            auth_token_file=_path(c.auth_token_file),
            insecure=bool(c.insecure),
            max_definition_size=c.max_definition_size,
            max_pipeline_ops=c.max_pipeline_ops,
            max_pipeline_depth=c.max_pipeline_depth,
            gc_dynamic_sharding_jobs=bool(c.gc_dynamic_sharding_jobs),
            object_store_config=_path(c.object_store_config),
        )

    @property
    def target(self) -> str:
        """``"grpc://host:port"``."""
        return f"grpc://{self._address}"

    @property
    def peer_address(self) -> str:
        """``"host:port"`` of the Raft peer listener (what :func:`sluice.add_node` takes)."""
        return str(self._running().peer_address)

    @property
    def node_id(self) -> int:
        """This replica's Raft id."""
        return int(self._config.node_id)

    @property
    def leader_id(self) -> Optional[int]:
        """The leader this replica knows of; ``None`` while there is none or once stopped."""
        return self._running().leader_id  # type: ignore[no-any-return]

    def status(self) -> Dict[str, Any]:
        """This replica's view of the cluster, as ``sluice status`` prints it: ``leader``,
        ``term``, ``members``, ``workers``, ``jobs``, and ``iterations`` with their
        ``num_clients``::

            >>> import sluice
            >>> with sluice.DispatchServer() as dispatcher:
            ...     status = dispatcher.status()
            >>> status["state"], status["members"][0]["voter"]
            ('Leader', True)
        """
        return json.loads(_native.status(self._address))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        state = "not started" if self._native is None else self.target
        return f"DispatchServer(node_id={self._config.node_id}, {state})"


class WorkerServer(_Server):
    """A worker serving in this process; it registers with the dispatcher and runs tasks."""

    def __init__(self, config: WorkerConfig, start: bool = True) -> None:
        self._config = config
        self._native: Optional[_native.WorkerServer] = None
        if start:
            self.start()

    def _launch(self) -> _native.WorkerServer:
        c = self._config
        return _native.WorkerServer(
            c.dispatcher_address,
            c.host,
            int(c.port),
            list(c.worker_tags or []),
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            data_roots=[str(r) for r in c.data_roots or []],
            tls_cert=_path(c.tls_cert),
            tls_key=_path(c.tls_key),
            tls_ca=_path(c.tls_ca),
            auth_token_file=_path(c.auth_token_file),
            insecure=bool(c.insecure),
            python=(sys.executable or None) if c.python_executors != 0 else None,
            python_executors=_executors(c.python_executors),
            worker_address=c.worker_address,
            memory_budget=c.memory_budget_bytes,
            memory_reserve=c.memory_reserve_bytes,
            max_pipeline_ops=c.max_pipeline_ops,
            max_pipeline_depth=c.max_pipeline_depth,
            cross_trainer_cache_size=c.cross_trainer_cache_size_bytes,
            object_store_config=_path(c.object_store_config),
            compress_local_readers=bool(c.compress_local_readers),
            shared_memory=bool(c.shared_memory),
        )

    @property
    def address(self) -> str:
        """``host:port`` the worker is registered under: ``worker_address``, or the one it
        serves on."""
        return self._address

    def __repr__(self) -> str:
        state = "not started" if self._native is None else self._address
        return f"WorkerServer({state}, dispatcher={self._config.dispatcher_address!r})"


def _check_protocol(protocol: str) -> None:
    if protocol != "grpc":
        raise InvalidArgumentError(f"Unsupported protocol {protocol!r}; Sluice serves grpc")


def _executors(count: Optional[int]) -> Optional[int]:
    """``python_executors`` for the native worker: ``None`` for one per core."""
    if count is None or count == 0:
        return None
    if count < 0:
        raise InvalidArgumentError(f"`python_executors` must be 0 or more, got {count}")
    return int(count)


def _path(path: Optional[Any]) -> Optional[str]:
    """A path given as ``str`` or ``os.PathLike``, as the native server takes it."""
    return None if path is None else str(path)


def _peers(peers: Optional[Peers]) -> List[tuple]:
    if peers is None:
        return []
    if isinstance(peers, Mapping):
        items: Dict[int, str] = {int(k): str(v) for k, v in peers.items()}
        return sorted(items.items())
    return [(i + 1, str(addr)) for i, addr in enumerate(peers)]


def make_credentials(
    out: Any,
    hosts: Sequence[str] = (),
    workers: Sequence[str] = (),
    days: int = 365,
    worker_hosts: Sequence[str] = (),
) -> List[str]:
    """Writes a cluster's credentials into the new directory ``out``, offline, as ``sluice
    certs`` does: a CA (``ca.pem``), a certificate per role (``dispatcher``, ``worker`` or one
    per entry of ``workers``, ``NAME`` or ``NAME=HOST,...``, ``client``, ``admin``; the
    dispatcher's certificate names ``hosts``, each worker's ``worker_hosts`` and its own hosts,
    besides the loopback names), and token files (``tokens`` for dispatchers, ``worker.tokens`` for
    workers, ``client.token`` and ``admin.token``). Nothing existing is overwritten. Returns the
    paths written::

        >>> import pathlib, tempfile, sluice
        >>> with tempfile.TemporaryDirectory() as d:
        ...     files = sluice.make_credentials(pathlib.Path(d) / "certs")
        ...     sorted(pathlib.Path(f).name for f in files)[:4]
        ['admin.key', 'admin.pem', 'admin.token', 'ca.key']
    """
    return [
        str(p)
        for p in _native.make_credentials(
            str(out), list(hosts), list(workers), days, list(worker_hosts)
        )
    ]
