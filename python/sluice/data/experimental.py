"""``sluice.data.experimental``: the names of ``tf.data.experimental`` that tf.data code uses
with Sluice's datasets.

- ``SHARD_HINT`` (-1): ``dataset.shard(SHARD_HINT, SHARD_HINT)`` is a placeholder the HINT
  auto-shard policy replaces by each worker's ``shard(num_workers, worker_index)``.
- ``AUTOTUNE`` (-1), ``INFINITE_CARDINALITY`` (-1), ``UNKNOWN_CARDINALITY`` (-2).
- ``ignore_errors(log_warning=False)``, ``unbatch()``, ``cardinality()``: transformations for
  ``dataset.apply``.
- ``AutoShardPolicy``, ``ExternalStatePolicy``, ``DistributeOptions``: for :class:`Options`.

>>> from sluice.data import Dataset
>>> from sluice.data import experimental
>>> [int(x) for x in Dataset.range(4).batch(2).apply(experimental.unbatch())]
[0, 1, 2, 3]
"""

from __future__ import annotations

from typing import Any, Callable

from sluice.data.dataset import AUTOTUNE, Dataset
from sluice.data.options import AutoShardPolicy, DistributeOptions, ExternalStatePolicy

SHARD_HINT = -1
"""tf.data's ``SHARD_HINT``: see :meth:`Dataset.shard`."""

INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2


def ignore_errors(log_warning: bool = False) -> Callable[[Dataset], Dataset]:
    """``dataset.apply(ignore_errors())`` is ``dataset.ignore_errors(log_warning)``."""

    def _apply(dataset: Dataset) -> Dataset:
        return dataset.ignore_errors(log_warning=log_warning)

    return _apply


def unbatch() -> Callable[[Dataset], Dataset]:
    """``dataset.apply(unbatch())`` is ``dataset.unbatch()``."""

    def _apply(dataset: Dataset) -> Dataset:
        return dataset.unbatch()

    return _apply


def cardinality(dataset: Any) -> int:
    """``dataset.cardinality()``."""
    return dataset.cardinality()


__all__ = [
    "AUTOTUNE",
    "AutoShardPolicy",
    "DistributeOptions",
    "ExternalStatePolicy",
    "INFINITE_CARDINALITY",
    "SHARD_HINT",
    "UNKNOWN_CARDINALITY",
    "cardinality",
    "ignore_errors",
    "unbatch",
]
