"""``parse_example`` on TFRecord files of ``tf.train.Example`` records, plain and compressed,
read through real servers: the right dict of arrays, and errors that name the feature."""

from __future__ import annotations

import numpy as np
import pytest

import sluice
from sluice import errors
from sluice.data import TFRecordDataset
from sluice.io import FixedLenFeature, TFRecordWriter, VarLenFeature, serialize_example

FEATURES = {
    "label": FixedLenFeature((), np.int64),
    "xy": FixedLenFeature([2], np.float32),
    "image": FixedLenFeature((), bytes),
    "tags": VarLenFeature(np.int64),
    "weight": FixedLenFeature((), np.float32, default_value=1.0),
}


def _write(path, records, compression=None) -> None:  # type: ignore[no-untyped-def]
    with TFRecordWriter(str(path), compression) as w:
        for r in records:
            w.write(serialize_example(r))


def _record(i: int) -> dict:
    record = {
        "label": i,
        "xy": np.array([i, i + 0.5], np.float32),
        "image": f"img{i}".encode(),
        "tags": np.arange(i, dtype=np.int64),
    }
    if i % 2:
        record["weight"] = np.float32(0.25)
    return record


def _plain(element: dict) -> tuple:
    return (
        int(element["label"]),
        element["xy"].tolist(),
        bytes(element["image"]),
        element["tags"].tolist(),
        float(element["weight"]),
    )


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_parse_example_reads_tfrecords_of_examples_through_the_workers(
    cluster, tmp_path, compression
):
    for f in range(2):
        _write(tmp_path / f"{f}.tfrecord", [_record(3 * f + i) for i in range(3)], compression)
    ds = (
        TFRecordDataset(str(tmp_path / "*.tfrecord"), compression_type=compression)
        .parse_example(FEATURES)
        .apply(sluice.distribute("distributed_epoch", cluster.target))
    )
    got = sorted(_plain(e) for e in ds)
    want = [
        (i, [float(i), i + 0.5], f"img{i}".encode(), list(range(i)), 0.25 if i % 2 else 1.0)
        for i in range(6)
    ]
    assert got == want
    spec = ds.element_spec
    assert sorted(spec) == ["image", "label", "tags", "weight", "xy"]
    assert spec["xy"].shape == (2,) or list(spec["xy"].shape) == [2]


def test_element_dtypes_are_those_of_the_features(tmp_path):
    _write(tmp_path / "a.tfrecord", [_record(2)], "GZIP")
    (element,) = list(
        TFRecordDataset(str(tmp_path / "a.tfrecord"), "GZIP").parse_example(FEATURES)
    )
    assert element["label"].dtype == np.int64
    assert element["xy"].dtype == np.float32
    assert element["tags"].dtype == np.int64
    assert isinstance(element["image"], bytes)


def test_a_missing_feature_without_a_default_names_it(cluster, tmp_path):
    record = _record(1)
    del record["label"]
    _write(tmp_path / "a.tfrecord", [record], "GZIP")
    ds = (
        TFRecordDataset(str(tmp_path / "a.tfrecord"), compression_type="GZIP")
        .parse_example(FEATURES)
        .apply(sluice.distribute("parallel_epochs", cluster.target))
    )
    # A worker's failure reaches the reader as an OpError carrying the worker's message.
    with pytest.raises(errors.OpError) as e:
        list(ds)
    message = str(e.value)
    assert (
        "parse_example: feature 'label' is missing from the record and has no default value"
        in message
    ), message


def test_a_feature_of_another_type_names_it_and_what_was_found(tmp_path):
    record = _record(1)
    record["label"] = np.float32(1.0)
    _write(tmp_path / "a.tfrecord", [record])
    with pytest.raises(errors.InvalidArgumentError) as e:
        list(TFRecordDataset(str(tmp_path / "a.tfrecord")).parse_example(FEATURES))
    assert str(e.value) == (
        f"record 0 (0-based) of '{tmp_path / 'a.tfrecord'}': "
        "parse_example: feature 'label' should be an int64_list (int64), "
        "found a float_list of 1 value"
    )


def test_bad_feature_specs_and_compression_types_are_refused_at_the_call(tmp_path):
    ds = TFRecordDataset(str(tmp_path / "*.tfrecord"))
    with pytest.raises(errors.InvalidArgumentError):
        ds.parse_example({"a": FixedLenFeature((), np.int32)})
    with pytest.raises(errors.InvalidArgumentError):
        ds.parse_example({"a": FixedLenFeature([3], np.int64, default_value=[1, 2])})
    with pytest.raises(errors.InvalidArgumentError):
        TFRecordDataset(str(tmp_path / "*.tfrecord"), compression_type="LZ4")
