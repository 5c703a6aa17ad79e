"""padded_batch, unbatch, ignore_errors, cache, random, shard(SHARD_HINT), Options and
``sluice.data.experimental``: locally and through a real dispatcher and workers."""

from __future__ import annotations

import os

import numpy as np
import pytest

import sluice
from sluice.data import Dataset, Options, TensorSpec, experimental
from sluice.errors import InvalidArgumentError, InvalidArgumentValueError, OpError

MODES = ["parallel_epochs", "distributed_epoch"]


def lists(ds):  # type: ignore[no-untyped-def]
    return [x.tolist() if isinstance(x, np.ndarray) else x for x in ds]


def ragged(n: int) -> Dataset:
    """Vectors 0..k for k = 1..n, as int32 (a dtype a Python literal must take)."""
    return Dataset.range(1, n + 1).map(
        lambda k: np.arange(k, dtype=np.int32),
        output_signature=TensorSpec((None,), "int32"),
    )


def sort_rows(batches):  # type: ignore[no-untyped-def]
    return sorted(b.tolist() for b in batches)


# padded_batch


def test_padded_batch_pads_to_the_batch_largest_or_the_given_shape():
    assert lists(ragged(3).padded_batch(2)) == [[[0, 0], [0, 1]], [[0, 1, 2]]]
    assert lists(ragged(3).padded_batch(2, drop_remainder=True)) == [[[0, 0], [0, 1]]]
    got = lists(ragged(3).padded_batch(3, padded_shapes=[4], padding_values=-1))
    assert got == [[[0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, -1]]]
    got = lists(ragged(2).padded_batch(2, padded_shapes=[None]))
    assert got == [[[0, 0], [0, 1]]]
    spec = ragged(3).padded_batch(2, padded_shapes=[5], drop_remainder=True).element_spec
    assert spec == TensorSpec((2, 5), "int32")
    assert ragged(3).padded_batch(2).cardinality() == 2


def test_padded_batch_of_nested_elements():
    ds = Dataset.range(1, 3).map(
        lambda k: (np.arange(k), {"w": np.array([b"w"] * int(k), dtype=object)}),
        output_signature=(TensorSpec((None,), "int64"), {"w": TensorSpec((None,), "string")}),
    )
    [(ints, words)] = list(
        ds.padded_batch(2, padded_shapes=([3], {"w": [None]}), padding_values=(7, {"w": "pad"}))
    )
    assert ints.tolist() == [[0, 7, 7], [0, 1, 7]]
    assert words["w"].tolist() == [[b"w", b"pad"], [b"w", b"w"]]
    [(_, words)] = list(ds.padded_batch(2))
    assert words["w"].tolist() == [[b"w", b""], [b"w", b"w"]]


def test_padded_batch_errors_follow_tf_data():
    with pytest.raises(OpError, match=r"Attempted to pad to a smaller size.*\[2\].*\[3\]"):
        list(ragged(3).padded_batch(3, padded_shapes=[2]))
    with pytest.raises(TypeError, match="values type float64 does not match type int32"):
        ragged(3).padded_batch(2, padding_values=np.float64(1))
    with pytest.raises(TypeError, match="does not match type int32"):
        ragged(3).padded_batch(2, padding_values=0.5)
    with pytest.raises(InvalidArgumentValueError, match="should be scalars"):
        ragged(3).padded_batch(2, padding_values=np.array([1], dtype=np.int32))
    with pytest.raises(InvalidArgumentValueError, match="dimension"):
        ragged(3).padded_batch(2, padded_shapes=([3], [3]))
    pairs = Dataset.from_tensor_slices(([[1]], [[2]]))
    with pytest.raises(InvalidArgumentValueError, match="element's structure"):
        pairs.padded_batch(2, padded_shapes=[3])
    with pytest.raises(InvalidArgumentError, match="not compatible"):
        Dataset.from_tensor_slices([[1, 2, 3]]).padded_batch(2, padded_shapes=[2])


def test_absurd_padded_shapes_are_refused_before_allocating():
    with pytest.raises(InvalidArgumentError, match="more than the limit of"):
        ragged(2).padded_batch(2**20, padded_shapes=[2**40]).element_spec
    with pytest.raises(OpError, match="more than the limit of"):
        list(ragged(2).padded_batch(2**30, padded_shapes=[2**20]))


# unbatch


def test_unbatch_splits_the_first_dimension():
    assert [int(x) for x in Dataset.range(5).batch(2).unbatch()] == [0, 1, 2, 3, 4]
    ds = Dataset.from_tensor_slices(([[1, 2], [3, 4]], [[b"a", b"b"], [b"c", b"d"]])).unbatch()
    assert [(int(a), b) for a, b in ds] == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert ds.cardinality() == 4
    assert [int(x) for x in Dataset.range(4).batch(2).apply(experimental.unbatch())] == [
        0,
        1,
        2,
        3,
    ]
    with pytest.raises(InvalidArgumentError, match="Cannot unbatch an input with scalar"):
        Dataset.range(3).unbatch()


# ignore_errors


def _fails_on_odd(x):  # type: ignore[no-untyped-def]
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


def test_ignore_errors_drops_failed_elements_locally():
    ds = Dataset.range(7).map(_fails_on_odd)
    with pytest.raises(ValueError):
        list(ds)
    assert [int(x) for x in ds.ignore_errors()] == [0, 2, 4, 6]
    assert [int(x) for x in ds.apply(experimental.ignore_errors(log_warning=True))] == [0, 2, 4, 6]
    assert ds.ignore_errors().cardinality() == experimental.UNKNOWN_CARDINALITY


# cache


def test_cache_in_memory_and_in_a_file(tmp_path):
    calls = tmp_path / "calls"

    def count(x):  # type: ignore[no-untyped-def]
        with open(calls, "a") as f:
            f.write(".")
        return x

    ds = Dataset.range(3).map(count).cache().repeat(3)
    assert [int(x) for x in ds] == [0, 1, 2] * 3
    assert calls.read_text() == "..."
    path = tmp_path / "c.cache"
    ds = Dataset.range(3).map(count).cache(path)
    assert [int(x) for x in ds.take(2)] == [0, 1]
    assert not path.exists()
    assert [int(x) for x in ds.repeat(2)] == [0, 1, 2, 0, 1, 2]
    assert path.exists()
    before = calls.read_text()
    assert [int(x) for x in ds] == [0, 1, 2]
    assert calls.read_text() == before
    assert [p for p in os.listdir(tmp_path) if "partial" in p] == []


# random


def test_random_is_seeded_and_endless():
    a = lists(Dataset.random(seed=3).take(4))
    assert a == lists(Dataset.random(seed=3).take(4))
    assert a != lists(Dataset.random(seed=4).take(4))
    assert Dataset.random().cardinality() == experimental.INFINITE_CARDINALITY
    assert Dataset.random(seed=1).element_spec == TensorSpec((), "int64")


# shard and sluice.data.experimental


def test_shard_accepts_shard_hint_and_checks_its_arguments():
    assert experimental.SHARD_HINT == -1 and experimental.AUTOTUNE == -1
    hinted = Dataset.range(8).shard(experimental.SHARD_HINT, experimental.SHARD_HINT)
    assert "SHARD_HINT" in repr(hinted)
    with pytest.raises(OpError, match="SHARD_HINT"):
        list(hinted)
    zero = r"Number of shards must be greater than zero \(currently num_shards = 0\)\."
    with pytest.raises(ValueError, match=zero):
        Dataset.range(8).shard(0, 0)
    with pytest.raises(ValueError, match=r"Index must be between 0 and 2 \(currently index = 3\)"):
        Dataset.range(8).shard(3, 3)
    with pytest.raises(ValueError, match=r"currently index = -1"):
        Dataset.range(8).shard(3, experimental.SHARD_HINT)


def test_shard_hint_is_resolved_by_the_hint_policy():
    from sluice.strategy import DistributeStrategy

    ds = Dataset.range(8).shard(experimental.SHARD_HINT, experimental.SHARD_HINT).batch(2)
    seen = []
    for pipeline in (0, 1):
        strategy = DistributeStrategy(
            2, num_input_pipelines=2, input_pipeline_id=pipeline, auto_shard_policy="HINT"
        )
        values = [
            int(v)
            for step in strategy.experimental_distribute_dataset(ds)
            for b in step
            for v in np.ravel(b)
        ]
        assert values and all(v % 2 == pipeline for v in values), (pipeline, values)
        seen.append(values)


# Options


def test_options_merge_and_travel_with_the_dataset():
    o = Options()
    assert o.deterministic is True
    assert o.experimental_distribute.auto_shard_policy == experimental.AutoShardPolicy.AUTO
    with pytest.raises(AttributeError, match="Cannot set the property bogus on Options."):
        o.bogus = 1  # type: ignore[attr-defined]
    a = Options()
    a.deterministic = False
    a.experimental_external_state_policy = experimental.ExternalStatePolicy.FAIL
    b = Options()
    b.experimental_distribute.auto_shard_policy = experimental.AutoShardPolicy.DATA
    ds = Dataset.range(3).with_options(a).map("square").with_options(b)
    got = ds.options()
    assert got.deterministic is False
    assert got.experimental_external_state_policy == experimental.ExternalStatePolicy.FAIL
    assert got.experimental_distribute.auto_shard_policy == experimental.AutoShardPolicy.DATA
    c = Options()
    c.deterministic = True
    assert ds.with_options(c).options().deterministic is True
    assert [int(x) for x in ds] == [0, 1, 4]
    # Read back from the definition too.
    fresh = Dataset(ds._native)
    assert fresh.options() == got


def test_strategy_takes_the_dataset_auto_shard_policy():
    from sluice.strategy import DistributeStrategy

    strategy = DistributeStrategy(
        2, num_input_pipelines=2, input_pipeline_id=0, auto_shard_policy="DATA"
    )

    def values(ds):  # type: ignore[no-untyped-def]
        return sorted(
            int(v)
            for step in strategy.experimental_distribute_dataset(ds)
            for b in step
            for v in np.ravel(b)
        )

    plain = Dataset.range(8).batch(2)
    assert values(plain) == [0, 1, 4, 5]  # the strategy's DATA: every other batch
    off = Options()
    off.experimental_distribute.auto_shard_policy = experimental.AutoShardPolicy.OFF
    assert values(plain.with_options(off)) == list(range(8))


# Through the service


def _served(ds, mode, cluster):  # type: ignore[no-untyped-def]
    return ds.apply(sluice.distribute(mode, cluster.target))


@pytest.mark.parametrize("mode", MODES)
def test_padded_batch_and_unbatch_through_the_service(cluster, mode):
    copies = 2 if mode == "parallel_epochs" else 1
    got = sort_rows(_served(ragged(4).padded_batch(2, padding_values=-1), mode, cluster))
    want = sort_rows(ragged(4).padded_batch(2, padding_values=-1)) * copies
    assert got == sorted(want)
    got = sorted(int(x) for x in _served(Dataset.range(6).batch(3).unbatch(), mode, cluster))
    assert got == sorted(list(range(6)) * copies)


@pytest.mark.parametrize("mode", MODES)
def test_ignore_errors_through_the_service(cluster, mode):
    copies = 2 if mode == "parallel_epochs" else 1
    ds = Dataset.range(10).map(_fails_on_odd).ignore_errors()
    got = sorted(int(x) for x in _served(ds, mode, cluster))
    assert got == sorted([0, 2, 4, 6, 8] * copies)


def test_cache_through_the_service(cluster, tmp_path):
    # parallel_epochs: each worker caches its own pass and replays it.
    got = sorted(
        int(x) for x in _served(Dataset.range(3).cache().repeat(2), "parallel_epochs", cluster)
    )
    assert got == sorted([0, 1, 2] * 4)
    path = tmp_path / "served.cache"
    got = sorted(
        int(x)
        for x in _served(Dataset.range(3).cache(str(path)).repeat(2), "parallel_epochs", cluster)
    )
    assert got == sorted([0, 1, 2] * 4)
    assert path.exists()
    # distributed_epoch: refused, naming why.
    with pytest.raises(OpError, match="cache cannot run in distributed_epoch mode"):
        list(_served(Dataset.range(3).cache().repeat(2), "distributed_epoch", cluster))
    # A cache file outside the workers' data roots is refused.
    with pytest.raises(OpError, match="refused"):
        list(_served(Dataset.range(3).cache("/c.cache"), "parallel_epochs", cluster))
    # After distribute the cache runs in the reader.
    served = _served(Dataset.range(3), "distributed_epoch", cluster).cache()
    assert sorted(int(x) for x in served) == [0, 1, 2]


def test_random_through_the_service(cluster):
    got = lists(_served(Dataset.random(seed=5).take(3), "parallel_epochs", cluster))
    want = lists(Dataset.random(seed=5).take(3))
    assert sorted(got) == sorted(want * 2)
    with pytest.raises(OpError, match="Dataset.random has no splits"):
        list(_served(Dataset.random(seed=5).take(3), "distributed_epoch", cluster))
