"""The native image ops through real servers: ``decode_image`` on PNG and JPEG bytes made here
(PNGs written with the standard library, a JPEG as fixed bytes), ``resize``, dict keys, and the
errors of corrupt images, which name the file and record they came from."""

from __future__ import annotations

import os
import re
import struct
import zlib

import numpy as np
import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TensorSpec, TFRecordDataset
from sluice.io import FixedLenFeature, TFRecordWriter, serialize_example

# An 8x4 JPEG (baseline, 4:4:4) of the solid colour (200, 40, 90).
SOLID_JPEG = bytes.fromhex(
    "ffd8ffe000104a46494600010200000100010000ffc00011080004000803011100021101031101ffdb004300"
    "080606070605080707070909080a0c140d0c0b0b0c1912130f141d1a1f1e1d1a1c1c20242e2720222c231c1c"
    "2837292c30313434341f27393d38323c2e333432ffdb0043010909090c0b0c180d0d1832211c213232323232"
    "3232323232323232323232323232323232323232323232323232323232323232323232323232323232323232"
    "32ffc4001f0000010501010101010100000000000000000102030405060708090a0bffc400b5100002010303"
    "020403050504040000017d01020300041105122131410613516107227114328191a1082342b1c11552d1f024"
    "33627282090a161718191a25262728292a3435363738393a434445464748494a535455565758595a63646566"
    "6768696a737475767778797a838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7"
    "b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffc400"
    "1f0100030101010101010101010000000000000102030405060708090a0bffc400b511000201020404030407"
    "05040400010277000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a"
    "162434e125f11718191a262728292a35363738393a434445464748494a535455565758595a63646566676869"
    "6a737475767778797a82838485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9"
    "bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8f9faffda000c030100"
    "02110311003f00e76a4fd10fffd9"
)


def png(image: np.ndarray) -> bytes:
    """A PNG of a uint8 (h, w, channels) array, channels 1, 3 or 4 (no compression tricks)."""
    h, w, c = image.shape
    colour_type = {1: 0, 3: 2, 4: 6}[c]

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + image[y].astype(np.uint8).tobytes() for y in range(h))
    header = struct.pack(">IIBBBBB", w, h, 8, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def images(n: int, channels: int) -> list:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (2 + i % 3, 3 + i % 2, channels), dtype=np.uint8) for i in range(n)]


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_pngs_decode_exactly_on_the_workers(cluster, mode, channels):
    originals = images(6, channels)
    ds = Dataset.from_tensor_slices([png(a) for a in originals]).decode_image(channels=channels)
    assert ds.element_spec == TensorSpec((None, None, channels), np.uint8)
    got = list(ds.apply(sluice.distribute(mode, cluster.target)).as_numpy_iterator())
    per_epoch = 2 if mode == "parallel_epochs" else 1  # parallel_epochs: each of 2 workers
    assert len(got) == len(originals) * per_epoch
    key = lambda a: (a.shape, a.tobytes())  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, originals * per_epoch))


def test_a_dict_entry_decodes_and_resizes_leaving_the_rest(cluster):
    originals = images(4, 3)
    ds = (
        Dataset.from_tensor_slices(
            {"image": [png(a) for a in originals], "label": np.arange(4, dtype=np.int64)}
        )
        .decode_image(key="image", channels=1)
        .resize(key="image", size=(5, 6))
    )
    assert ds.element_spec == {
        "image": TensorSpec((5, 6, 1), np.uint8),
        "label": TensorSpec((), np.int64),
    }
    got = list(ds.apply(sluice.distribute("distributed_epoch", cluster.target)))
    assert sorted(int(e["label"]) for e in got) == [0, 1, 2, 3]
    for e in got:
        assert e["image"].shape == (5, 6, 1) and e["image"].dtype == np.uint8


def test_a_jpeg_decodes_and_resizes_on_the_workers(cluster):
    ds = Dataset.from_tensor_slices([SOLID_JPEG]).decode_image().resize((16, 2))
    [image] = list(ds.apply(sluice.distribute("distributed_epoch", cluster.target)))
    assert image.shape == (16, 2, 3)
    assert np.abs(image.astype(int) - np.array([200, 40, 90])).max() <= 3


def test_images_in_tfrecord_files_decode_through_the_service(cluster, tmp_path):
    originals = images(5, 3)
    path = tmp_path / "images.tfrecord"
    with TFRecordWriter(str(path)) as w:
        for a in originals:
            w.write(png(a))
    ds = TFRecordDataset(str(path)).decode_image()
    got = list(ds.apply(sluice.distribute("distributed_epoch", cluster.target)))
    key = lambda a: (a.shape, a.tobytes())  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, originals))


def test_a_corrupt_image_fails_the_read_naming_the_op_and_key(cluster, tmp_path):
    good = png(images(1, 3)[0])
    ds = Dataset.from_tensor_slices({"image": [good, good[: len(good) // 2]]}).decode_image(
        key="image"
    )
    with pytest.raises(errors.InvalidArgumentError, match="decode_image of key 'image' failed"):
        list(ds)
    remote = ds.apply(sluice.distribute("distributed_epoch", cluster.target))
    with pytest.raises(errors.OpError, match="decode_image of key 'image' failed: corrupt"):
        list(remote)


@pytest.mark.parametrize("mode", [None, "parallel_epochs", "distributed_epoch"])
def test_a_corrupt_jpeg_in_tfrecord_files_names_its_file_and_record(cluster, tmp_path, mode):
    # Record 2 (0-based) of the second file is a JPEG cut short; all the others are whole.
    for f in range(2):
        with TFRecordWriter(str(tmp_path / f"{f}.tfrecord"), "GZIP") as w:
            for i in range(4):
                image = SOLID_JPEG[:200] if (f, i) == (1, 2) else SOLID_JPEG
                w.write(serialize_example({"image": image, "label": 4 * f + i}))
    ds = (
        TFRecordDataset(str(tmp_path / "*.tfrecord"), compression_type="GZIP")
        .parse_example({"image": FixedLenFeature((), bytes), "label": FixedLenFeature((), np.int64)})
        .decode_image(key="image")
    )
    if mode is not None:
        ds = ds.apply(sluice.distribute(mode, cluster.target))
    # A worker names the file by its canonical path (its data roots resolve symlinks).
    bad = [str(tmp_path / "1.tfrecord"), os.path.realpath(tmp_path / "1.tfrecord")]
    names = "|".join(re.escape(b) for b in bad)
    want = rf"record 2 \(0-based\) of '({names})': decode_image of key 'image' failed: "
    with pytest.raises(errors.OpError, match=want):
        list(ds)


def test_bad_arguments_are_refused_when_the_op_is_added():
    ds = Dataset.from_tensor_slices([b"x"])
    cases = [
        (lambda: ds.decode_image(channels=2), "decode_image channels must be 1, 3 or 4, got 2"),
        (lambda: ds.resize(size=(0, 3)), "resize height must be between 1 and 16384, got 0"),
        (lambda: ds.resize(size=(3, 16385)), "resize width must be between 1 and 16384, got 16385"),
        (lambda: ds.resize(), "resize needs size=(height, width)"),
        (lambda: ds.resize(size=(1, 2, 3)), "resize size must be (height, width), got (1, 2, 3)"),
        (lambda: ds.decode_image(key=3), "key must be a dict key (a str) or None, got 3"),
    ]
    for make, message in cases:
        with pytest.raises(errors.InvalidArgumentError) as e:
            make()
        assert str(e.value) == message
