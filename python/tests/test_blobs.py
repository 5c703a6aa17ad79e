"""In-memory arrays far over the definition limit: their data travels as blobs, outside the
dispatcher's Raft log, and workers fetch them by digest."""

from __future__ import annotations

import numpy as np

import sluice
from sluice.data import Dataset


def test_from_tensor_slices_of_49_mb_of_images_is_read_exactly_once(cluster):
    # 4,000 images of 64x64x3 bytes: 49 MB, three times the default 16 MiB definition limit.
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(4000, 64, 64, 3), dtype=np.uint8)
    labels = np.arange(4000, dtype=np.int64)
    ds = Dataset.from_tensor_slices((images, labels)).apply(
        sluice.distribute("distributed_epoch", cluster.target)
    )
    seen = []
    for image, label in ds.as_numpy_iterator():
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert np.array_equal(image, images[label]), f"image {label} intact"
        seen.append(int(label))
    assert sorted(seen) == list(range(4000))


def test_from_tensors_of_a_large_table_is_read_whole(cluster):
    table = np.linspace(0.0, 1.0, 1_000_000, dtype=np.float32).reshape(1000, 1000)
    ds = Dataset.from_tensors(table).apply(sluice.distribute("parallel_epochs", cluster.target))
    got = list(ds.as_numpy_iterator())
    # One element per worker under parallel_epochs.
    assert len(got) == len(cluster.workers)
    for element in got:
        assert np.array_equal(element, table)


def test_an_array_over_the_definition_limit_registers_when_small_tensors_alone_would_not():
    # A dispatcher whose definitions may hold 1000 bytes: the 400 KB array is a blob, so it fits.
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(max_definition_size=1000))
    worker = sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target))
    try:
        values = np.arange(100_000, dtype=np.int32)
        ds = Dataset.from_tensor_slices(values).apply(
            sluice.distribute("distributed_epoch", dispatcher.target)
        )
        assert sorted(int(v) for v in ds.as_numpy_iterator()) == list(range(100_000))
    finally:
        worker.stop()
        dispatcher.stop()
