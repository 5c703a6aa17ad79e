"""tf.distribute's input side: a dataset spread over the replicas that train in sync.

``DistributeStrategy`` stands where a ``tf.distribute.Strategy`` stands in a training loop's
input code: ``experimental_distribute_dataset`` splits each global batch between the replicas
(tf's rebatching), ``distribute_datasets_from_function`` calls a function with an
:class:`InputContext` to build a per-replica dataset. Each step is a tuple with one numpy value
per local replica; a replica left without data at the end gets an empty batch of the right
dtype and inner shape. The input is a local dataset or one read through the service::

    >>> import sluice
    >>> from sluice.data import Dataset
    >>> strategy = sluice.DistributeStrategy(num_replicas_in_sync=2)
    >>> dist = strategy.experimental_distribute_dataset(Dataset.range(9).batch(4))
    >>> [tuple(v.tolist() for v in step) for step in dist]
    [([0, 1], [2, 3]), ([4, 5], [6, 7]), ([8], [])]
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional

from sluice import _native
from sluice.data import Dataset
from sluice.errors import InvalidArgumentError, OutOfRangeError

__all__ = [
    "DistributeStrategy",
    "DistributedDataset",
    "DistributedIterator",
    "InputContext",
    "OptionalValue",
]

_POLICIES = ("OFF", "AUTO", "FILE", "DATA", "HINT")


class InputContext:
    """What a ``dataset_fn`` learns about its input pipeline, as ``tf.distribute.InputContext``.

    >>> ctx = InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=4)
    >>> ctx.get_per_replica_batch_size(8)
    2
    """

    __slots__ = ("_native",)

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ) -> None:
        self._native = _native.InputContext(
            int(num_input_pipelines), int(input_pipeline_id), int(num_replicas_in_sync)
        )

    @property
    def num_input_pipelines(self) -> int:
        """The number of input pipelines (tf: one per worker)."""
        return self._native.num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This pipeline, in ``range(num_input_pipelines)``."""
        return self._native.input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """The replicas training in sync, over all pipelines."""
        return self._native.num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size / num_replicas_in_sync``; ``InvalidArgumentError`` with tf's text
        when it does not divide."""
        return self._native.get_per_replica_batch_size(int(global_batch_size))

    def __repr__(self) -> str:
        return repr(self._native)


class OptionalValue:
    """The result of ``get_next_as_optional``, as ``tf.experimental.Optional``."""

    __slots__ = ("_value", "_has_value")

    def __init__(self, value: Any = None, has_value: bool = False) -> None:
        self._value = value
        self._has_value = has_value

    def has_value(self) -> bool:
        return self._has_value

    def get_value(self) -> Any:
        """The step; ``InvalidArgumentError`` (tf's text) when there is none."""
        if not self._has_value:
            raise InvalidArgumentError("The optional does not have a value")
        return self._value

    def __repr__(self) -> str:
        return f"OptionalValue({self._value!r})" if self._has_value else "OptionalValue(None)"


class DistributedIterator:
    """One epoch of a :class:`DistributedDataset`; each step is a tuple, one value per local
    replica."""

    def __init__(self, native: _native.DistributedIterator, element_spec: Any) -> None:
        self._native = native
        self._element_spec = element_spec

    @property
    def element_spec(self) -> Any:
        """The spec of one replica's value."""
        return self._element_spec

    def get_next(self) -> tuple:
        """The next step; ``OutOfRangeError`` at the end of the epoch."""
        step = self._native.get_next_as_optional()
        if step is None:
            raise OutOfRangeError("End of sequence")
        return step

    def get_next_as_optional(self) -> OptionalValue:
        """The next step as an :class:`OptionalValue`, empty at the end of the epoch."""
        step = self._native.get_next_as_optional()
        return OptionalValue() if step is None else OptionalValue(step, True)

    def __iter__(self) -> Iterator[tuple]:
        return self

    def __next__(self) -> tuple:
        step = self._native.get_next_as_optional()
        if step is None:
            raise StopIteration
        return step

    def close(self) -> None:
        """Ends the epoch now (a service read is released)."""
        self._native.close()

    def state_dict(self) -> Dict[str, Any]:
        """The reader's state after the steps returned so far: a dict of ``str`` and ``int``
        that :meth:`DistributedDataset.load_state_dict` resumes from (see
        ``sluice.data.Dataset.load_state_dict``).

        Needs an input read through the service with a ``job_name`` (a local input raises
        :class:`~sluice.errors.FailedPreconditionError`). A state counts whole input elements,
        so it is taken where every replica value cut from the elements read was handed out:
        after every step with one input pipeline; with ``num_input_pipelines`` W each global
        batch makes W steps, so take states every W steps (elsewhere
        :class:`~sluice.errors.FailedPreconditionError` says so).
        """
        return self._native.state_dict()


class DistributedDataset:
    """A dataset spread over the replicas; every iteration is a new epoch."""

    def __init__(self, native: _native.DistributedDataset) -> None:
        self._native = native

    @property
    def element_spec(self) -> Any:
        """The spec of one replica's value in a step (a known batch dimension divided)."""
        return self._native.element_spec()

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self._native.iter(), self.element_spec)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Makes the next ``iter()`` resume its epoch at ``state``, a dict
        :meth:`DistributedIterator.state_dict` returned (same checks as
        ``sluice.data.Dataset.load_state_dict``)."""
        self._native.load_state_dict(state)


class DistributeStrategy:
    """The input side of a ``tf.distribute.Strategy`` for one input pipeline.

    ``num_replicas_in_sync`` replicas train in sync, fed by ``num_input_pipelines`` pipelines
    (tf: one per worker), each feeding ``num_replicas_in_sync / num_input_pipelines`` local
    replicas; this process runs pipeline ``input_pipeline_id``. ``auto_shard_policy`` (tf's
    ``AutoShardPolicy``: ``"OFF"``, ``"AUTO"``, ``"FILE"``, ``"DATA"``, ``"HINT"``) shards
    ``experimental_distribute_dataset``'s input between pipelines when there are several.

    >>> DistributeStrategy(4, num_input_pipelines=2, input_pipeline_id=1)
    DistributeStrategy(num_replicas_in_sync=4, num_input_pipelines=2, input_pipeline_id=1, \
auto_shard_policy='AUTO')
    """

    def __init__(
        self,
        num_replicas_in_sync: int = 1,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        auto_shard_policy: str = "AUTO",
    ) -> None:
        policy = str(getattr(auto_shard_policy, "name", auto_shard_policy)).upper()
        if policy not in _POLICIES:
            raise InvalidArgumentError(
                f"unknown auto_shard_policy {auto_shard_policy!r}; expected one of {_POLICIES}"
            )
        self.num_replicas_in_sync = int(num_replicas_in_sync)
        self.num_input_pipelines = int(num_input_pipelines)
        self.input_pipeline_id = int(input_pipeline_id)
        self.auto_shard_policy = policy

    def experimental_distribute_dataset(self, dataset: Dataset) -> DistributedDataset:
        """``dataset`` is batched by the global batch size; each step gives each local replica
        its part of a global batch (sizes as tf's rebatching).

        The auto-shard policy is the dataset's own when its options set one
        (``options.experimental_distribute.auto_shard_policy``, where tf reads it), else
        this strategy's ``auto_shard_policy``."""
        policy = self.auto_shard_policy
        distribute = dataset.options().experimental_distribute
        if distribute._is_set("auto_shard_policy"):
            policy = distribute.auto_shard_policy.name
        return DistributedDataset(
            _native.DistributedDataset.rebatched(
                dataset._native,
                self.num_replicas_in_sync,
                self.num_input_pipelines,
                self.input_pipeline_id,
                policy,
            )
        )

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Dataset], options: Optional[Any] = None
    ) -> DistributedDataset:
        """Calls ``dataset_fn(input_context)``; the dataset it returns is batched per replica
        and sharded as the function chooses (no auto-sharding, no splitting, as tf); its
        elements go to the local replicas in turn."""
        del options  # tf's InputOptions: nothing here depends on them
        context = self.input_context()
        dataset = dataset_fn(context)
        if not isinstance(dataset, Dataset):
            raise InvalidArgumentError(
                f"dataset_fn must return a sluice.data.Dataset, got {type(dataset).__name__}"
            )
        return DistributedDataset(
            _native.DistributedDataset.per_replica(
                dataset._native,
                self.num_replicas_in_sync,
                self.num_input_pipelines,
                self.input_pipeline_id,
            )
        )

    def input_context(self) -> InputContext:
        """The :class:`InputContext` of this pipeline."""
        return InputContext(
            self.num_input_pipelines, self.input_pipeline_id, self.num_replicas_in_sync
        )

    def __repr__(self) -> str:
        return (
            f"DistributeStrategy(num_replicas_in_sync={self.num_replicas_in_sync}, "
            f"num_input_pipelines={self.num_input_pipelines}, "
            f"input_pipeline_id={self.input_pipeline_id}, "
            f"auto_shard_policy={self.auto_shard_policy!r})"
        )
