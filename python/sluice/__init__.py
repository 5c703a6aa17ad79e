"""Sluice: a data service for ML input pipelines, with tf.data service's Python API.

Port a tf.data service program by changing its import: ``sluice`` has
``tf.data.experimental.service``'s names (``DispatchServer``, ``WorkerServer``, ``distribute``,
``register_dataset``, ``from_dataset_id``, ``ShardingPolicy``, ``CrossTrainerCache``) and
``sluice.data.Dataset`` has tf.data's. Elements arrive as numpy values::

    >>> import sluice
    >>> from sluice.data import Dataset
    >>> dispatcher = sluice.DispatchServer()
    >>> workers = [sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target)) for _ in range(2)]
    >>> ds = Dataset.range(5).apply(sluice.distribute("parallel_epochs", dispatcher.target))
    >>> sorted(int(x) for x in ds)
    [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    >>> for server in workers + [dispatcher]:
    ...     server.stop()

Errors are :mod:`sluice.errors` exceptions, under :class:`sluice.errors.OpError`.
"""

from __future__ import annotations

from sluice import data, errors, io, metrics
from sluice.server import (
    DispatcherConfig,
    DispatchServer,
    WorkerConfig,
    WorkerServer,
    make_credentials,
)
from sluice.strategy import (
    DistributedDataset,
    DistributedIterator,
    DistributeStrategy,
    InputContext,
    OptionalValue,
)
from sluice.service import (
    CrossTrainerCache,
    ShardingPolicy,
    add_node,
    distribute,
    from_dataset_id,
    register_dataset,
    remove_node,
)

__version__ = "0.1.0"

__all__ = [
    "CrossTrainerCache",
    "DispatchServer",
    "DispatcherConfig",
    "DistributeStrategy",
    "DistributedDataset",
    "DistributedIterator",
    "InputContext",
    "OptionalValue",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "add_node",
    "data",
    "distribute",
    "errors",
    "from_dataset_id",
    "io",
    "make_credentials",
    "metrics",
    "register_dataset",
    "remove_node",
]
