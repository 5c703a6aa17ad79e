"""tf.distribute's input side: global batches split per replica, input functions, the end."""

from __future__ import annotations

import numpy as np
import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TensorSpec


def as_lists(steps):
    return [[v.tolist() for v in step] for step in steps]


def test_a_global_batch_is_split_between_two_replicas():
    strategy = sluice.DistributeStrategy(num_replicas_in_sync=2)
    dist = strategy.experimental_distribute_dataset(Dataset.range(9).batch(4))
    assert dist.element_spec == TensorSpec((None,), np.int64)
    steps = list(dist)
    assert as_lists(steps) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], []]]
    assert all(type(step) is tuple and len(step) == 2 for step in steps)
    empty = steps[-1][1]
    assert isinstance(empty, np.ndarray) and empty.dtype == np.int64 and empty.shape == (0,)
    assert as_lists(dist) == as_lists(steps)  # every iteration is a new epoch


def test_an_empty_batch_keeps_the_inner_shape_and_dtype():
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    strategy = sluice.DistributeStrategy(num_replicas_in_sync=2)
    dist = strategy.experimental_distribute_dataset(Dataset.from_tensor_slices(rows).batch(4))
    assert dist.element_spec == TensorSpec((None, 2), np.float32)
    last = list(dist)[-1]
    assert last[0].tolist() == [[8.0, 9.0]]
    assert last[1].dtype == np.float32 and last[1].shape == (0, 2)


def test_get_next_ends_with_out_of_range_and_the_optional_is_empty():
    strategy = sluice.DistributeStrategy(num_replicas_in_sync=2)
    dataset = Dataset.range(4).batch(4, drop_remainder=True)
    it = iter(strategy.experimental_distribute_dataset(dataset))
    assert it.element_spec == TensorSpec((2,), np.int64)
    first = it.get_next_as_optional()
    assert first.has_value()
    assert [v.tolist() for v in first.get_value()] == [[0, 1], [2, 3]]
    end = it.get_next_as_optional()
    assert not end.has_value()
    with pytest.raises(errors.InvalidArgumentError, match="does not have a value"):
        end.get_value()
    with pytest.raises(errors.OutOfRangeError, match="End of sequence"):
        it.get_next()


def test_input_functions_get_their_context():
    strategy = sluice.DistributeStrategy(4, num_input_pipelines=2, input_pipeline_id=1)
    seen = []

    def dataset_fn(ctx: sluice.InputContext) -> Dataset:
        seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        batch = ctx.get_per_replica_batch_size(8)
        return Dataset.range(16).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(batch)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    assert seen == [(2, 1, 4)]
    assert dist.element_spec == TensorSpec((None,), np.int64)
    assert as_lists(dist) == [[[1, 3], [5, 7]], [[9, 11], [13, 15]]]


def test_a_per_replica_batch_size_must_divide_the_global_one():
    ctx = sluice.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=4)
    assert ctx.get_per_replica_batch_size(8) == 2
    with pytest.raises(errors.InvalidArgumentError) as e:
        ctx.get_per_replica_batch_size(7)
    want = "The `global_batch_size` 7 is not divisible by `num_replicas_in_sync` 4 "
    assert str(e.value) == want


def test_bad_configurations_fail_with_tf_texts():
    uneven = "cannot be divided by `num_workers` \\(2\\)"
    with pytest.raises(errors.InvalidArgumentError, match=uneven):
        sluice.DistributeStrategy(3, num_input_pipelines=2).experimental_distribute_dataset(
            Dataset.range(4).batch(2)
        )
    with pytest.raises(errors.InvalidArgumentError, match="Invalid `input_dataset`"):
        sluice.DistributeStrategy(2).experimental_distribute_dataset(Dataset.range(4))
    with pytest.raises(errors.InvalidArgumentError, match="unknown auto_shard_policy"):
        sluice.DistributeStrategy(2, auto_shard_policy="SOMETIMES")


def test_two_pipelines_auto_shard_a_local_dataset():
    def pipeline(i):
        strategy = sluice.DistributeStrategy(4, num_input_pipelines=2, input_pipeline_id=i)
        return as_lists(strategy.experimental_distribute_dataset(Dataset.range(16).batch(4)))

    assert pipeline(0) == [[[0], [1]], [[2], [3]], [[8], [9]], [[10], [11]]]
    assert pipeline(1) == [[[4], [5]], [[6], [7]], [[12], [13]], [[14], [15]]]


def test_a_service_read_is_split_per_replica(cluster):
    # Batched after the service, in this process: the workers' order is not deterministic, the
    # batch sizes are.
    service = sluice.distribute("distributed_epoch", cluster.target)
    ds = Dataset.range(9).apply(service).batch(4)
    strategy = sluice.DistributeStrategy(num_replicas_in_sync=2)
    dist = strategy.experimental_distribute_dataset(ds)
    assert dist.element_spec == TensorSpec((None,), np.int64)
    steps = list(dist)
    assert [[len(v) for v in step] for step in steps] == [[2, 2], [2, 2], [1, 0]]
    assert steps[-1][1].dtype == np.int64
    assert sorted(x for step in as_lists(steps) for v in step for x in v) == list(range(9))
