"""tf.data service's reading API: ``distribute``, ``register_dataset``, ``from_dataset_id``.

``service`` is a dispatcher's address in any form the ``sluice`` command line takes:
``host:port``, ``grpc://host:port``, or several replicas comma-separated
(``"h1:5050,h2:5050,h3:5050"``); a ``(protocol, address)`` tuple as tf.data takes works too.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, List, Optional, Tuple, Union

from sluice import _native
from sluice.data import Dataset
from sluice.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
)

__all__ = [
    "ShardingPolicy",
    "CrossTrainerCache",
    "distribute",
    "register_dataset",
    "from_dataset_id",
    "add_node",
    "remove_node",
]


class ShardingPolicy(enum.IntEnum):
    """tf.data's processing modes.

    ``OFF`` is ``"parallel_epochs"`` (every worker runs the whole dataset), ``DYNAMIC`` is
    ``"distributed_epoch"`` (workers share one epoch, each element read once); ``FILE``,
    ``DATA``, ``FILE_OR_DATA`` and ``HINT`` shard statically over a fixed worker list.
    """

    OFF = 0
    DYNAMIC = 1
    FILE = 2
    DATA = 3
    FILE_OR_DATA = 4
    HINT = 5


class CrossTrainerCache:
    """Trainers reading the same named job share its elements, each at its own position.

    >>> CrossTrainerCache(trainer_id="trainer 0")
    CrossTrainerCache(trainer_id='trainer 0')

    An empty or missing ``trainer_id`` is refused, as tf.data refuses it (a ``ValueError``)::

        >>> CrossTrainerCache(trainer_id=None)
        Traceback (most recent call last):
        ...
        sluice.errors.InvalidArgumentValueError: tf.data service cross-trainer cache requires a non-empty trainer ID.
    """

    __slots__ = ("trainer_id",)

    def __init__(self, trainer_id: str) -> None:
        if not trainer_id:
            raise InvalidArgumentValueError(
                "tf.data service cross-trainer cache requires a non-empty trainer ID."
            )
        self.trainer_id = trainer_id

    def __repr__(self) -> str:
        return f"CrossTrainerCache(trainer_id={self.trainer_id!r})"


ProcessingMode = Union[ShardingPolicy, str]
Service = Union[str, Tuple[str, str]]


def distribute(
    processing_mode: ProcessingMode,
    service: Service,
    job_name: Optional[str] = None,
    consumer_index: Optional[int] = None,
    num_consumers: Optional[int] = None,
    max_outstanding_requests: Optional[int] = None,
    data_transfer_protocol: Optional[str] = None,
    compression: Optional[str] = "AUTO",
    cross_trainer_cache: Optional[CrossTrainerCache] = None,
    target_workers: str = "AUTO",
    delivery: str = "exactly_once",
) -> Callable[[Dataset], Dataset]:
    """A transformation for ``dataset.apply`` that reads the dataset through the service.

    The ops before it run on the workers; ops chained after it run here, on the elements read.
    Every iteration of the result is a new epoch (of the named job ``job_name`` when given,
    which consumers share)::

        ds = sluice.data.Dataset.range(10).map("square")
        ds = ds.apply(sluice.distribute("distributed_epoch", dispatcher.target))
        sorted(int(x) for x in ds)   # each square once, from all workers

    The dataset is registered when the transformation is applied.

    ``delivery`` is ``"exactly_once"`` (the default: with ``distributed_epoch`` and the static
    sharding policies, every element of a finite epoch reaches the job's readers once, also
    when workers fail) or ``"at_most_once"`` (tf.data service's: what a failed worker held is
    lost). It is Sluice's own argument; tf.data has none.
    """
    del data_transfer_protocol  # Sluice has one transport
    _check_job(job_name, num_consumers)
    mode = _mode(processing_mode)
    address = _service(service)
    delivery = _delivery(delivery)

    def _apply(dataset: Dataset) -> Dataset:
        if mode.lower() not in ("off", "parallel_epochs"):
            refusal = dataset._native.unsplittable()
            if refusal is not None:
                raise InvalidArgumentError(refusal)
        native = _native.distribute(
            dataset._native,
            mode,
            address,
            job_name=job_name,
            consumer_index=consumer_index,
            num_consumers=num_consumers,
            max_outstanding_requests=_outstanding(max_outstanding_requests),
            compression=_compression(compression),
            cross_trainer_cache=_trainer_id(cross_trainer_cache),
            target_workers=_target_workers(target_workers),
            delivery=delivery,
        )
        return Dataset(native)

    return _apply


def register_dataset(
    service: Service,
    dataset: Dataset,
    compression: Optional[str] = "AUTO",
    dataset_id: Optional[str] = None,
) -> str:
    """Registers ``dataset`` with the dispatcher and returns its id.

    With ``dataset_id`` the id is that name; registering the same dataset under it again
    returns it, a different dataset under it fails. Read it with :func:`from_dataset_id`::

        dataset_id = sluice.register_dataset(dispatcher.target, Dataset.range(100))
    """
    return _native.register_dataset(
        _service(service), dataset._native, _compression(compression), dataset_id
    )


def from_dataset_id(
    processing_mode: ProcessingMode,
    service: Service,
    dataset_id: str,
    element_spec: Any = None,
    job_name: Optional[str] = None,
    consumer_index: Optional[int] = None,
    num_consumers: Optional[int] = None,
    max_outstanding_requests: Optional[int] = None,
    data_transfer_protocol: Optional[str] = None,
    cross_trainer_cache: Optional[CrossTrainerCache] = None,
    target_workers: str = "AUTO",
    delivery: str = "exactly_once",
) -> Dataset:
    """Reads a dataset registered with :func:`register_dataset`, by its id.

    The element spec comes from the dispatcher; an ``element_spec`` given here must equal it
    (else :class:`~sluice.errors.InvalidArgumentError`)::

        ds = sluice.from_dataset_id("parallel_epochs", dispatcher.target, dataset_id)
    """
    del data_transfer_protocol
    _check_job(job_name, num_consumers)
    native = _native.from_dataset_id(
        _mode(processing_mode),
        _service(service),
        str(dataset_id),
        job_name=job_name,
        consumer_index=consumer_index,
        num_consumers=num_consumers,
        max_outstanding_requests=_outstanding(max_outstanding_requests),
        cross_trainer_cache=_trainer_id(cross_trainer_cache),
        target_workers=_target_workers(target_workers),
        delivery=_delivery(delivery),
    )
    dataset = Dataset(native)
    if element_spec is None:
        return dataset
    try:
        known = dataset.element_spec
    except FailedPreconditionError:
        # A Python function's output, known only from elements: the caller's word is taken.
        native.assume_element_spec(element_spec)
        known = element_spec
    if element_spec != known:
        raise InvalidArgumentError(
            f"The `element_spec` {element_spec!r} does not match the element spec of dataset "
            f"{dataset_id}: {dataset.element_spec!r}"
        )
    return dataset


#: The processing modes tf.data takes as strings, and the names of `ShardingPolicy`.
_MODES = frozenset(["parallel_epochs", "distributed_epoch"]) | frozenset(
    p.name.lower() for p in ShardingPolicy
)


def _mode(mode: ProcessingMode) -> str:
    if isinstance(mode, ShardingPolicy):
        return mode.name.lower()
    if isinstance(mode, str) and mode.lower() in _MODES:
        return mode
    raise InvalidArgumentValueError(
        "tf.data service processing mode should be a "
        '`tf.data.experimental.service.ShardingPolicy`, `"parallel_epochs"`, or '
        f"`\"distributed_epoch\"`. Got {mode!r}."
    )


def _check_job(job_name: Any, num_consumers: Optional[int]) -> None:
    """tf.data's checks of a job's name, in its words."""
    if job_name is not None:
        if not isinstance(job_name, str):
            raise InvalidArgumentValueError(
                "`job_name` must be a string, but `job_name` was of type "
                f"{type(job_name)}. job_name={job_name}"
            )
        if not job_name:
            raise InvalidArgumentValueError("`job_name` must not be empty")
    elif num_consumers is not None:
        raise InvalidArgumentValueError(
            "`job_name` must be set when setting `num_consumers`. num_consumers was set to "
            f"{num_consumers}."
        )


def add_node(service: Service, node_id: int, peer_address: str) -> List[int]:
    """Adds replica ``node_id``, started with ``DispatcherConfig(join=True)`` and serving Raft
    at ``peer_address`` (its :attr:`DispatchServer.peer_address`), to the quorum at
    ``service``: it joins as a learner, catches up, then votes; it records its client address
    itself. Returns the voters after the change. A replica that has not caught up within 30
    seconds is removed again and ``FailedPreconditionError`` names it (the voters stay as they
    were); an id that is already a member, id 0, or a peer address that is not ``host:port``
    raises ``InvalidArgumentError``. The same as ``sluice admin add-node``; replicas
    started this way need no peer list agreed in advance, so every one can take port 0::

        >>> import sluice
        >>> first = sluice.DispatchServer()
        >>> second = sluice.DispatchServer(sluice.DispatcherConfig(node_id=2, join=True))
        >>> sluice.add_node(first.target, 2, second.peer_address)
        [1, 2]
        >>> sluice.remove_node(first.target, 2)
        [1]
        >>> for server in (second, first):
        ...     server.stop()
    """
    return list(_native.add_node(_service(service), int(node_id), str(peer_address)))


def remove_node(service: Service, node_id: int) -> List[int]:
    """Removes replica ``node_id`` from the quorum at ``service`` (even the leader: the others
    elect a new one). Returns the voters after the change. A removal after which the voters
    answering the leader would be no majority raises ``FailedPreconditionError``; a node that is
    no member raises ``NotFoundError``."""
    return list(_native.remove_node(_service(service), int(node_id)))


def _service(service: Service) -> str:
    if isinstance(service, tuple):
        if len(service) != 2:
            raise InvalidArgumentValueError(
                f"service must be a string or a tuple of (protocol, address), got {service!r}"
            )
        protocol, address = service
        return f"{protocol}://{address}"
    if not isinstance(service, str):
        raise InvalidArgumentValueError(
            "`service` must be a string, but `service` was of type "
            f"{type(service)}. service={service}"
        )
    if not service:
        raise InvalidArgumentValueError("`service` must not be empty")
    if service.count("://") > 1:
        raise InvalidArgumentValueError(f"Malformed `service` string has multiple '://': {service}.")
    return service


def _compression(compression: Optional[str]) -> str:
    """``"auto"`` or ``"none"``: tf.data's ``"AUTO"`` and ``None`` (any case, as tf.data's
    spellings); anything else is tf.data's ``ValueError``. Sluice compresses with snappy only
    where it shrinks an element (``"AUTO"``); it has no forced ``"SNAPPY"``."""
    if compression is None:
        return "none"
    if isinstance(compression, str) and compression.lower() in ("auto", "none"):
        return compression.lower()
    raise InvalidArgumentValueError(
        f"Invalid `compression` argument: {compression}. Must be one of ['auto', 'none']."
    )


def _outstanding(value: Optional[int]) -> Optional[int]:
    if value is None or value == -1:
        return None
    return max(int(value), 0)


def _trainer_id(cache: Optional[CrossTrainerCache]) -> Optional[str]:
    return None if cache is None else cache.trainer_id


def _delivery(delivery: str) -> str:
    if not isinstance(delivery, str):
        raise InvalidArgumentValueError(
            f"`delivery` must be 'exactly_once' or 'at_most_once', got {delivery!r}."
        )
    return delivery


def _target_workers(target: str) -> str:
    return str(target).upper()
