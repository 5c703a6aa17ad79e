# Copyright 2020 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# Ported to Sluice and modified: the test base of tf.data service's tests (test_base.py and
# multi_process_cluster.py), with Sluice's DispatchServer and WorkerServer.
"""tf.data's ``TestCluster``, ``TestWorker`` and ``MultiProcessCluster`` over Sluice's servers,
the readers with deadlines the ported cases use, and the marks they carry.

Every server listens on port 0 and keeps its journal in a temporary directory. Every read has a
deadline: a case that would hang fails instead (its reading thread is a daemon and is left
behind; the cluster is stopped when the case ends).
"""

from __future__ import annotations

import collections
import queue
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import numpy as np
import pytest

import sluice
from sluice.data import Dataset

#: tf.data's placeholders for the dispatcher's work directory.
TMP_WORK_DIR = "tmp_work_dir_placeholder"
NO_WORK_DIR = ""

#: tf.data's test settings (test_base.py).
TEST_HEARTBEAT_INTERVAL_MS = 100
TEST_WORKER_TIMEOUT_MS = 200

#: Seconds one read may take before the case fails: only a hang takes this long.
READ_TIMEOUT = 15.0

#: The worker tag tf.data gives workers colocated with a trainer.
COLOCATED = "COLOCATED"


# Marks: the reason's first word is its class, which the report and the tally group by.


def missing(what: str, raises: Any = AttributeError) -> Any:
    """A case that needs an op or feature Sluice does not have yet (strict: it must fail, and
    with ``raises``: a missing method is an ``AttributeError``)."""
    return pytest.mark.xfail(strict=True, raises=raises, reason=f"missing: {what}")


def bug(what: str) -> Any:
    """A case that gets a wrong result, error class or error text from Sluice (strict)."""
    return pytest.mark.xfail(strict=True, reason=f"bug: {what}")


def flaky(what: str) -> Any:
    """A case that passes only sometimes because of a Sluice bug: an xfail that may pass (not
    strict), so the suite neither fails nor hides it."""
    return pytest.mark.xfail(strict=False, reason=f"bug: flaky: {what}")


def not_applicable(what: str) -> Any:
    """A case about TensorFlow internals (graph mode, tf.function, GPUs, ...)."""
    return pytest.mark.skip(reason=f"not applicable: {what}")


def deliberate(what: str) -> Any:
    """A case whose expectation Sluice does not meet on purpose (docs/tfdata.md)."""
    return pytest.mark.skip(reason=f"deliberate difference: {what}")


def all_cluster_configurations() -> List[Any]:
    """tf.data's ``all_cluster_configurations``: (work_dir, fault_tolerant_mode)."""
    return [(TMP_WORK_DIR, True), (TMP_WORK_DIR, False), (NO_WORK_DIR, False)]


# Servers.


def _work_dir(work_dir: Optional[str]) -> Optional[str]:
    """Sluice's journal directory for tf.data's ``work_dir``: a Sluice dispatcher always keeps a
    journal (its Raft log); without a work dir it uses a temporary one, removed on stop."""
    if work_dir == TMP_WORK_DIR:
        return tempfile.mkdtemp(prefix="sluice-tfdata-")
    return work_dir or None


class TestWorker:
    """A worker in this process (tf.data's ``TestWorker``)."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        dispatcher_address: str,
        port: int = 0,
        worker_tags: Optional[List[str]] = None,
        worker_address: Optional[str] = None,
        python_executors: int = 0,
        data_roots: Optional[List[str]] = None,
        cross_trainer_cache_size_bytes: Optional[int] = None,
    ) -> None:
        self._dispatcher_address = dispatcher_address
        # tf.data's WorkerConfig field, passed on only when set (Sluice's has none yet).
        self._extra: Dict[str, Any] = {}
        if cross_trainer_cache_size_bytes is not None:
            self._extra["cross_trainer_cache_size_bytes"] = cross_trainer_cache_size_bytes
        self._port = port
        self._tags = worker_tags
        self._worker_address = worker_address
        self._python_executors = python_executors
        self._data_roots = data_roots
        self._server: Optional[sluice.WorkerServer] = None

    def _config(self, port: int) -> sluice.WorkerConfig:
        return sluice.WorkerConfig(
            self._dispatcher_address,
            port=port,
            worker_tags=self._tags,
            worker_address=self._worker_address,
            heartbeat_interval_ms=TEST_HEARTBEAT_INTERVAL_MS,
            python_executors=self._python_executors,
            data_roots=self._data_roots,
            **self._extra,
        )

    def start(self) -> None:
        self._server = sluice.WorkerServer(self._config(self._port))
        self._port = int(self._server._address.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def restart(self, use_same_port: bool = True) -> None:
        """Stops the worker if it runs and starts a new one, on the same port by default."""
        self.stop()
        if not use_same_port:
            self._port = 0
        self.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    def worker_address(self) -> str:
        assert self._server is not None
        return self._server.address


class TestCluster:
    """A dispatcher and ``num_workers`` workers in this process (tf.data's ``TestCluster``).

    ``fault_tolerant_mode`` is accepted for tf.data's sake: a Sluice dispatcher always journals.
    ``restart_dispatcher`` stops the dispatcher and starts a new one on the same port from the
    same journal, which Sluice's one-replica quorum allows.
    """

    __test__ = False

    def __init__(
        self,
        num_workers: int,
        dispatcher_port: int = 0,
        work_dir: Optional[str] = TMP_WORK_DIR,
        fault_tolerant_mode: bool = True,
        job_gc_timeout_ms: Optional[int] = None,
        worker_timeout_ms: Optional[int] = None,
        client_timeout_ms: Optional[int] = None,
        start: bool = True,
        worker_addresses: Optional[List[str]] = None,
        python_executors: int = 0,
        data_roots: Optional[List[str]] = None,
    ) -> None:
        del fault_tolerant_mode  # always on in Sluice
        if worker_addresses is not None and not worker_addresses:
            worker_addresses = None  # tf.data's empty list: no static worker list
        self._data_roots = data_roots
        self._python_executors = python_executors
        self._config = sluice.DispatcherConfig(
            port=dispatcher_port,
            work_dir=_work_dir(work_dir),
            job_gc_timeout_ms=job_gc_timeout_ms,
            worker_timeout_ms=worker_timeout_ms,
            client_timeout_ms=client_timeout_ms,
            worker_addresses=worker_addresses,
            data_roots=data_roots,
        )
        if self._config.work_dir is None:
            # A restart needs the journal: keep it in a directory of our own.
            self._config.work_dir = tempfile.mkdtemp(prefix="sluice-tfdata-")
        self.dispatcher = sluice.DispatchServer(self._config, start=start)
        self.workers: List[TestWorker] = []
        for _ in range(num_workers):
            self.add_worker(start=start)
        _LIVE.append(self)

    def dispatcher_address(self) -> str:
        if self.dispatcher._native is None:  # not started yet: its configured port
            return f"{self._config.host}:{self._config.port}"
        return self.dispatcher.target.split("://")[1]

    @property
    def target(self) -> str:
        return f"grpc://{self.dispatcher_address()}"

    def make_worker(self, **kwargs: Any) -> TestWorker:
        kwargs.setdefault("python_executors", self._python_executors)
        kwargs.setdefault("data_roots", self._data_roots)
        return TestWorker(self.dispatcher_address(), **kwargs)

    def add_worker(self, start: bool = True, **kwargs: Any) -> TestWorker:
        worker = self.make_worker(**kwargs)
        if start:
            worker.start()
        self.workers.append(worker)
        return worker

    def start_dispatcher(self) -> None:
        self.dispatcher.start()

    def start_workers(self) -> None:
        for worker in self.workers:
            worker.start()

    def stop_dispatcher(self) -> None:
        self.dispatcher.stop()

    def stop_worker(self, index: int) -> None:
        self.workers[index].stop()

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()

    def restart_dispatcher(self) -> None:
        """Stops the dispatcher and starts a new one with the same port and journal."""
        port = int(self.dispatcher_address().rsplit(":", 1)[1])
        self.dispatcher.stop()
        self._config.port = port
        self.dispatcher = sluice.DispatchServer(self._config)

    def status(self) -> Dict[str, Any]:
        return self.dispatcher.status()

    def num_registered_workers(self) -> int:
        return len(self.status()["workers"])

    def num_tasks(self, address: str) -> int:
        """tf.data's ``worker.num_tasks()`` in a one-worker cluster: the tasks the dispatcher
        keeps, finished or not, until their iteration is collected."""
        workers = [w["address"] for w in self.status()["workers"]]
        assert workers == [address], f"num_tasks needs a one-worker cluster, got {workers}"
        return self.num_tasks_on_workers()

    def num_tasks_on_workers(self) -> int:
        """The tasks of every iteration the dispatcher keeps (finished ones until collected)."""
        return sum(len(i["tasks"]) for i in self.status()["iterations"])

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.dispatcher.stop()


# Remote workers: a helper process hosts the workers of a `MultiProcessCluster` that are not in
# the reader's process, so they are not local to it (tf.data runs each in its own process).

_REMOTE_HOST = textwrap.dedent(
    """
    import json, sys
    import sluice
    workers = {}
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["op"] == "start":
                w = sluice.WorkerServer(sluice.WorkerConfig(
                    command["dispatcher"], worker_tags=command["tags"],
                    worker_address=command["worker_address"],
                    heartbeat_interval_ms=100,
                    python_executors=command["python_executors"],
                    data_roots=command["data_roots"]))
                workers[len(workers)] = w
                reply = {"id": len(workers) - 1, "address": w.address}
            elif command["op"] == "stop":
                workers[command["id"]].stop()
                reply = {}
            else:
                break
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    for w in workers.values():
        w.stop()
    """
)


class RemoteWorkerError(RuntimeError):
    """A remote worker did not start (tf.data raises RuntimeError from the worker's process)."""


class _RemoteHost:
    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _REMOTE_HOST],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._replies: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._replies.put(line)

    def call(self, **command: Any) -> Dict[str, Any]:
        import json

        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        try:
            reply = json.loads(self._replies.get(timeout=READ_TIMEOUT))
        except queue.Empty:
            raise AssertionError(f"the remote worker host did not answer {command['op']}")
        if "error" in reply:
            raise RemoteWorkerError(reply["error"])
        return reply  # type: ignore[no-any-return]

    def stop(self) -> None:
        self._process.kill()
        self._process.wait()


class MultiProcessCluster:
    """tf.data's ``MultiProcessCluster``: a dispatcher, ``num_local_workers`` workers in this
    process and ``num_remote_workers`` workers in another process."""

    def __init__(
        self,
        num_local_workers: int,
        num_remote_workers: int,
        worker_tags: Optional[List[str]] = None,
        worker_addresses: Optional[List[str]] = None,
        data_roots: Optional[List[str]] = None,
        python_executors: int = 0,
    ) -> None:
        self._worker_tags = worker_tags
        self._data_roots = data_roots
        self._python_executors = python_executors
        # As tf.data's test workers, register as "localhost:<port>", which static worker lists
        # of "localhost" entries match.
        self._worker_address = "localhost:%port%"
        self.cluster = TestCluster(
            num_workers=0,
            worker_addresses=worker_addresses,
            data_roots=data_roots,
            python_executors=python_executors,
        )
        self._remote: Optional[_RemoteHost] = None
        self._remote_addresses: List[str] = []
        self.local_workers: List[TestWorker] = []
        try:
            for _ in range(num_local_workers):
                self.start_local_worker(worker_tags)
            for _ in range(num_remote_workers):
                self.start_remote_worker(worker_tags)
        except BaseException:
            self.stop()
            raise
        _LIVE.append(self)

    @property
    def dispatcher(self) -> sluice.DispatchServer:
        return self.cluster.dispatcher

    @property
    def target(self) -> str:
        return self.cluster.target

    def dispatcher_address(self) -> str:
        return self.cluster.dispatcher_address()

    def start_local_worker(self, worker_tags: Optional[List[str]] = None) -> None:
        worker = self.cluster.add_worker(
            worker_tags=worker_tags, worker_address=self._worker_address
        )
        self.local_workers.append(worker)

    def start_remote_worker(self, worker_tags: Optional[List[str]] = None) -> None:
        if self._remote is None:
            self._remote = _RemoteHost()
        reply = self._remote.call(
            op="start",
            dispatcher=self.dispatcher_address(),
            tags=worker_tags or [],
            worker_address=self._worker_address,
            data_roots=self._data_roots,
            python_executors=self._python_executors,
        )
        self._remote_addresses.append(reply["address"])

    def restart_local_workers(self) -> None:
        for worker in self.local_workers:
            worker.restart()

    def restart_dispatcher(self) -> None:
        self.cluster.restart_dispatcher()

    def num_registered_workers(self) -> int:
        return self.cluster.num_registered_workers()

    def stop(self) -> None:
        if self._remote is not None:
            self._remote.stop()
            self._remote = None
        self.cluster.stop()


#: Clusters and readers made by the running case, stopped when it ends (see conftest.py).
_LIVE: List[Any] = []
_READERS: List[Any] = []


def stop_live_clusters() -> None:
    """Closes the case's readers (an open one would make the interpreter's exit wait on its
    release), then stops its clusters."""
    while _READERS:
        _READERS.pop().release(timeout=1.0)
    while _LIVE:
        _LIVE.pop().stop()


# Reading with deadlines.


class EndOfSequence(Exception):
    """tf.data's OutOfRangeError at the end of an iterator."""


class Next:
    """``self.getNext(ds)``: each call returns the next element or raises ``EndOfSequence``;
    a call that takes more than ``timeout`` seconds fails the case. A daemon thread reads."""

    def __init__(self, dataset: Any, timeout: float = READ_TIMEOUT) -> None:
        self._timeout = timeout
        self._requests: "queue.Queue[Optional[Callable[[], Any]]]" = queue.Queue()
        self._replies: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self.iterator: Any = None
        _READERS.append(self)
        self.iterator = self._run(lambda: iter(dataset))

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            try:
                self._replies.put((True, request()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self._replies.put((False, e))

    def _run(self, fn: Callable[[], Any]) -> Any:
        self._requests.put(fn)
        try:
            ok, value = self._replies.get(timeout=self._timeout)
        except queue.Empty:
            raise AssertionError(f"a read took more than {self._timeout} s (a hang)") from None
        if not ok:
            raise value
        return value

    def __call__(self) -> Any:
        def step() -> Any:
            try:
                return next(self.iterator)
            except StopIteration:
                raise EndOfSequence() from None

        return self._run(step)

    def rest(self) -> List[Any]:
        """``self.getIteratorOutput(get_next)``: every element left."""
        out = []
        while True:
            try:
                out.append(self())
            except EndOfSequence:
                return out

    def close(self) -> None:
        self._requests.put(None)

    def release(self, timeout: float = READ_TIMEOUT) -> None:
        """tf.data's ``del it``: the iterator goes away (and with it its client). Closed by
        the reading thread, unless that thread is stuck in a read."""
        iterator, self.iterator = self.iterator, None
        close = getattr(iterator, "close", None)
        if close is not None:
            self._requests.put(close)
            try:
                self._replies.get(timeout=timeout)
            except queue.Empty:
                pass
        self._requests.put(None)
        self._thread.join(timeout)
        del iterator
        import gc

        gc.collect()

    def __del__(self) -> None:
        self._requests.put(None)


def get_dataset_output(dataset: Any, timeout: float = READ_TIMEOUT) -> List[Any]:
    """Every element of one epoch of ``dataset``, as Python values."""
    get_next = Next(dataset, timeout)
    try:
        return [py(x) for x in get_next.rest()]
    finally:
        get_next.release()


def py(value: Any) -> Any:
    """A numpy element as Python values: lists for arrays, ints for scalars, tuples and dicts
    kept."""
    if isinstance(value, tuple):
        return tuple(py(v) for v in value)
    if isinstance(value, dict):
        return {k: py(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _key(value: Any) -> str:
    return repr(value)


def assert_dataset_produces(
    dataset: Any, expected: Iterable[Any], assert_items_equal: bool = False
) -> None:
    """tf.data's ``assertDatasetProduces``: one epoch of ``dataset`` is ``expected`` (in any
    order with ``assert_items_equal``)."""
    output = get_dataset_output(dataset)
    expected = [py(e) for e in expected]
    if assert_items_equal:
        assert collections.Counter(map(_key, output)) == collections.Counter(map(_key, expected))
    else:
        assert output == expected


def assert_count_equal(a: Iterable[Any], b: Iterable[Any]) -> None:
    a, b = [py(x) for x in a], [py(x) for x in b]
    assert collections.Counter(map(_key, a)) == collections.Counter(map(_key, b))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = READ_TIMEOUT) -> None:
    """Polls ``condition`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


# tf.data's dataset helpers (test_base.py).


def make_distributed_dataset(
    dataset: Dataset, cluster: Any, processing_mode: Any = "parallel_epochs", **kwargs: Any
) -> Dataset:
    """``dataset`` read through ``cluster``'s service (tf.data's ``make_distributed_dataset``;
    Sluice has no ``task_refresh_interval_hint_ms``: its heartbeats are long polls)."""
    return dataset.apply(sluice.distribute(processing_mode, cluster.target, **kwargs))


def make_distributed_range_dataset(num_elements: int, cluster: Any, **kwargs: Any) -> Dataset:
    return make_distributed_dataset(Dataset.range(num_elements), cluster, **kwargs)


def make_coordinated_read_dataset(
    cluster: Any, num_consumers: int, sharding_policy: Any = sluice.ShardingPolicy.OFF
) -> "CoordinatedReader":
    """tf.data's ``make_coordinated_read_dataset``: ``num_consumers`` consumers of one job that
    each worker feeds groups of ``num_consumers`` consecutive numbers; element ``n`` of the
    result comes from consumer ``n % num_consumers``. tf.data reads the consumers with a
    parallel interleave; this reads each in its own thread, in the same order."""
    if sharding_policy not in (sluice.ShardingPolicy.OFF, sluice.ShardingPolicy.DYNAMIC):
        raise ValueError(f"Unsupported sharding policy: {sharding_policy}")
    # Start from 0 so that a new worker is seen with ShardingPolicy.OFF.
    ds = Dataset.from_tensors(np.int64(0))
    ds = ds.concatenate(Dataset.random())

    def make_group(x: Any) -> Dataset:
        x = x % (2**32)
        return Dataset.range(x * num_consumers, (x + 1) * num_consumers)

    ds = ds.flat_map(make_group)
    consumers = [
        make_distributed_dataset(
            ds,
            cluster,
            job_name="test",
            processing_mode=sharding_policy,
            consumer_index=consumer_index,
            num_consumers=num_consumers,
        )
        for consumer_index in range(num_consumers)
    ]
    return CoordinatedReader(consumers)


class CoordinatedReader:
    """Reads ``consumers`` in parallel, one thread each, yielding round-robin."""

    def __init__(self, consumers: List[Dataset]) -> None:
        self._consumers = consumers

    def take(self, count: int) -> List[Any]:
        """The first ``count`` elements: each round, every consumer's next element, requested
        at once (a consumer's read blocks until every consumer asks for the round)."""
        readers = [Next(c) for c in self._consumers]
        out: List[Any] = []
        while len(out) < count:
            out.extend(_read_round(readers))
        return out[:count]


def _read_round(readers: List[Next]) -> List[Any]:
    results: List[Any] = [None] * len(readers)
    failures: List[BaseException] = []

    def read(i: int) -> None:
        try:
            results[i] = py(readers[i]())
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            failures.append(e)

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(readers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(READ_TIMEOUT + 1)
    if failures:
        raise failures[0]
    return results


def check_coordinated_read_groups(results: List[Any], num_consumers: int) -> None:
    """tf.data's ``checkCoordinatedReadGroups``: each group of ``num_consumers`` results is
    consecutive, i.e. came from one worker in one round."""
    groups = [results[i : i + num_consumers] for i in range(0, len(results), num_consumers)]
    incorrect = [
        g for g in groups if any(g[0] + offset != g[offset] for offset in range(1, len(g)))
    ]
    assert not incorrect, f"Incorrect groups: {incorrect}.\nAll groups: {groups}"
