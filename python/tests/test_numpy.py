"""Elements as numpy: dtypes, shapes, strings, tuples and dicts round-trip exactly."""

from __future__ import annotations

import numpy as np
import pytest

import sluice
from sluice.data import Dataset, TensorSpec

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float32,
    np.float64,
]


def distributed(dataset: Dataset, target: str) -> Dataset:
    return dataset.apply(sluice.distribute("distributed_epoch", target))


def sample(dtype, shape) -> np.ndarray:
    values = np.arange(int(np.prod(shape)) or 0).reshape(shape)
    if dtype is np.bool_:
        return values % 3 == 0
    if np.issubdtype(dtype, np.floating):
        return (values * 1.5 - 7.25).astype(dtype)
    if np.issubdtype(dtype, np.signedinteger):
        return (values - 3).astype(dtype)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes_and_shapes_round_trip_through_the_service(cluster, dtype):
    source = sample(dtype, (4, 2, 3))
    ds = Dataset.from_tensor_slices(source)
    assert ds.element_spec == TensorSpec((2, 3), dtype)
    local = list(ds.as_numpy_iterator())
    remote = list(distributed(ds, cluster.target).as_numpy_iterator())
    remote.sort(key=lambda a: a.tobytes())
    expected = sorted(source, key=lambda a: a.tobytes())
    for got in (local, remote):
        assert len(got) == 4
        for a in got:
            assert isinstance(a, np.ndarray) and a.dtype == np.dtype(dtype) and a.shape == (2, 3)
    assert [a.tolist() for a in local] == [a.tolist() for a in source]
    assert [a.tolist() for a in remote] == [a.tolist() for a in expected]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_scalars_are_numpy_scalars(cluster, dtype):
    source = sample(dtype, (3,))
    for got in (
        list(Dataset.from_tensor_slices(source)),
        sorted(distributed(Dataset.from_tensor_slices(source), cluster.target)),
    ):
        assert all(isinstance(x, np.generic) and x.dtype == np.dtype(dtype) for x in got)
        assert sorted(got) == sorted(source.tolist())


def test_empty_and_high_rank_shapes(cluster):
    source = np.zeros((2, 0, 3), np.float32)
    got = list(distributed(Dataset.from_tensor_slices(source), cluster.target))
    assert [a.shape for a in got] == [(0, 3), (0, 3)]
    deep = sample(np.int32, (2, 1, 2, 1, 2))
    got = sorted(
        distributed(Dataset.from_tensor_slices(deep), cluster.target), key=lambda a: a.sum()
    )
    assert [a.tolist() for a in got] == deep.tolist()


def test_strings_are_bytes(cluster):
    words = ["", "a", "héllo", "x" * 1000]
    encoded = [w.encode() for w in words]
    ds = Dataset.from_tensor_slices(words)
    assert ds.element_spec == TensorSpec((), "string")
    assert list(ds) == encoded
    assert sorted(distributed(ds, cluster.target)) == sorted(encoded)
    batched = list(
        distributed(Dataset.from_tensor_slices([b"a", b"b", b"c"]).batch(3), cluster.target)
    )
    assert (
        len(batched) == 1
        and batched[0].dtype == object
        and batched[0].tolist() == [b"a", b"b", b"c"]
    )


def test_tuples_are_kept(cluster):
    ds = Dataset.from_tensor_slices(np.array([1.5, 2.5], np.float32)).enumerate(start=10)
    expected = [(10, np.float32(1.5)), (11, np.float32(2.5))]
    for got in (list(ds), sorted(distributed(ds, cluster.target), key=lambda t: int(t[0]))):
        assert got == expected
        assert all(
            isinstance(t, tuple) and t[0].dtype == np.int64 and t[1].dtype == np.float32
            for t in got
        )
    nested = Dataset.range(2).enumerate().enumerate()
    assert list(nested) == [(0, (0, 0)), (1, (1, 1))]


def test_large_tensors_arrive_over_the_received_buffer(cluster):
    source = np.arange(3 * 256 * 256, dtype=np.float32).reshape(3, 256, 256)
    got = sorted(
        distributed(Dataset.from_tensor_slices(source), cluster.target), key=lambda a: a[0, 0]
    )
    for a, b in zip(got, source):
        assert np.array_equal(a, b)
        assert type(a.base).__name__ == "TensorBuffer"  # no copy into a numpy-owned buffer
        assert len(a.base) == a.nbytes
    small = list(
        distributed(Dataset.from_tensor_slices(np.ones((2, 4), np.float32)), cluster.target)
    )
    assert all(a.flags.writeable for a in small)  # small tensors are copied, writable


def test_batches_of_scalars_are_arrays(cluster):
    got = sorted(
        (b.tolist() for b in distributed(Dataset.range(10).batch(4), cluster.target)),
        key=lambda b: b[0],
    )
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    floats = list(Dataset.range(3).map("to_float"))
    assert floats == [0.0, 1.0, 2.0] and all(x.dtype == np.float64 for x in floats)
