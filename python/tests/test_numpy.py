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


def test_image_sized_tensors_arrive_in_buffers_of_their_own_and_are_writable(cluster):
    # 48 KiB each: sent uncompressed apart from their batch, received into a buffer each,
    # handed to numpy without a copy, and the caller's to change.
    source = np.arange(4 * 64 * 64 * 3, dtype=np.float32).reshape(4, 64, 64, 3)
    ds = Dataset.from_tensor_slices(source).apply(
        sluice.distribute("distributed_epoch", cluster.target, compression=None)
    )
    got = sorted(ds, key=lambda a: a[0, 0, 0])
    assert len(got) == 4
    for a, b in zip(got, source):
        assert np.array_equal(a, b)
        assert type(a.base).__name__ == "TensorBuffer"
        assert a.flags.writeable
        a += 1  # in place: no error, and no other element changes
    for a, b in zip(got, source):
        assert np.array_equal(a, b + 1)


def test_batches_of_scalars_are_arrays(cluster):
    got = sorted(
        (b.tolist() for b in distributed(Dataset.range(10).batch(4), cluster.target)),
        key=lambda b: b[0],
    )
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    floats = list(Dataset.range(3).map("to_float"))
    assert floats == [0.0, 1.0, 2.0] and all(x.dtype == np.float64 for x in floats)


def structured_columns():
    return (
        np.array([[1, 2], [3, 4], [5, 6]], np.int32),
        {
            "label": ["a", "bb", "ccc"],
            "weight": np.array([0.5, 1.5, -2.0], np.float64),
            "nested": (np.array([True, False, True]), [7, 8, 9]),
        },
    )


def assert_structured_rows(rows):
    assert len(rows) == 3
    for i, (pair, extras) in enumerate(rows):
        assert isinstance(pair, np.ndarray) and pair.dtype == np.int32 and pair.shape == (2,)
        assert pair.tolist() == [2 * i + 1, 2 * i + 2]
        assert type(extras) is dict and list(extras) == ["label", "nested", "weight"]
        assert extras["label"] == [b"a", b"bb", b"ccc"][i]
        assert extras["weight"].dtype == np.float64
        assert extras["weight"] == [0.5, 1.5, -2.0][i]
        flag, number = extras["nested"]
        assert flag.dtype == np.bool_ and bool(flag) == (i != 1)
        assert number.dtype == np.int64 and int(number) == 7 + i


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_tuples_and_dicts_of_arrays_round_trip(cluster, mode):
    ds = Dataset.from_tensor_slices(structured_columns())
    assert ds.element_spec == (
        TensorSpec((2,), np.int32),
        {
            "label": TensorSpec((), "string"),
            "nested": (TensorSpec((), np.bool_), TensorSpec((), np.int64)),
            "weight": TensorSpec((), np.float64),
        },
    )
    assert ds.cardinality() == 3
    assert_structured_rows(list(ds))
    remote = list(ds.apply(sluice.distribute(mode, cluster.target)))
    remote.sort(key=lambda row: int(row[1]["nested"][1]))
    if mode == "parallel_epochs":  # every element once per worker
        assert len(remote) == 6
        remote = remote[::2]
    assert_structured_rows(remote)


def test_a_dict_element_arrives_as_a_dict(cluster):
    ds = Dataset.from_tensor_slices({"x": [1, 2], "y": np.array([3.0, 4.0], np.float32)})
    for got in (list(ds), sorted(distributed(ds, cluster.target), key=lambda d: int(d["x"]))):
        assert got == [{"x": 1, "y": np.float32(3.0)}, {"x": 2, "y": np.float32(4.0)}]
        assert all(type(d) is dict for d in got)
    batched = list(ds.batch(2))
    assert [sorted(b) for b in batched] == [["x", "y"]]
    assert batched[0]["x"].tolist() == [1, 2] and batched[0]["y"].dtype == np.float32


def test_slices_of_different_lengths_fail_as_tf_data():
    mismatch = "Dimensions 3 and 2 are not compatible"
    with pytest.raises(sluice.errors.InvalidArgumentError, match=mismatch):
        Dataset.from_tensor_slices(([1, 2, 3], [1, 2]))
    with pytest.raises(sluice.errors.InvalidArgumentError, match="rank at least 1"):
        Dataset.from_tensor_slices(([1, 2], 5))


def test_arrays_reach_the_native_side_as_arrays_copied_only_where_their_layout_needs_it():
    # A definition's constant is handed over as the array itself (the native side copies it
    # once, into a buffer that remembers its digest across registrations), not its bytes.
    from sluice._tensors import tensor_parts

    images = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    name, shape, data = tensor_parts(images)
    assert (name, shape) == ("uint8", [2, 4, 4, 3])
    assert data is images

    # Another byte order or a strided view is made little-endian and C-contiguous first.
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    _, _, data = tensor_parts(big_endian)
    assert data.dtype == np.dtype("<i4") and data.flags.c_contiguous
    assert np.array_equal(data, big_endian)
    _, shape, data = tensor_parts(images[:, ::2])
    assert shape == [2, 2, 4, 3] and data.flags.c_contiguous
    assert np.array_equal(data, images[:, ::2])

    # The native side copies the array it is handed: writes to the caller's array after the
    # dataset is made do not reach it.
    expected = images.copy()
    ds = Dataset.from_tensor_slices(images)
    images[:] = 0
    assert all(np.array_equal(got, want) for got, want in zip(ds.as_numpy_iterator(), expected))
    assert len(list(ds.as_numpy_iterator())) == 2
