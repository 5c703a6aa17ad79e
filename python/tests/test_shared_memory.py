"""Readers on the worker's machine read large elements from a shared memory region of their
stream: a worker in a process of its own, as users run it, and this process as the reader."""

from __future__ import annotations

import sys
from typing import Iterator

import numpy as np
import pytest

import sluice
from sluice.bench import _Child
from sluice.data import Dataset


class Servers:
    def __init__(self) -> None:
        self.dispatcher = _Child([sys.executable, "-m", "sluice.bench", "serve", "dispatcher"])
        try:
            self.worker = _Child(
                [sys.executable, "-m", "sluice.bench", "serve", "worker"]
                + ["--dispatcher", self.dispatcher.address, "--python-executors", "0"]
            )
        except BaseException:
            self.dispatcher.stop()
            raise

    def stop(self) -> None:
        self.worker.stop()
        self.dispatcher.stop()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.stop()


def images(n: int) -> np.ndarray:
    """`n` float32 images of 48 KiB, each holding its own index and position."""
    base = np.arange(64 * 64 * 3, dtype=np.float32).reshape(64, 64, 3)
    return np.stack([base + i * 100_000 for i in range(n)])


def fetch_regions() -> int:
    """This process's mappings of workers' fetch regions."""
    with open("/proc/self/maps") as maps:
        return sum("sluice-fetch" in line for line in maps)


def read(servers: Servers, data: np.ndarray, job: str) -> Iterator[np.ndarray]:
    ds = Dataset.from_tensor_slices(data).apply(
        sluice.distribute("parallel_epochs", servers.dispatcher.address, job_name=job)
    )
    return (np.asarray(x) for x in ds)


def test_a_reader_beside_its_worker_reads_from_the_workers_region(servers):
    data = images(200)
    assert fetch_regions() == 0
    kept = []
    for i, array in enumerate(read(servers, data, "shm-beside")):
        kept.append(array)
        if i == 100:
            # The worker runs in another process: a mapping here is the reader's own.
            assert fetch_regions() >= 1, "the reader mapped no region of the worker's"
    assert len(kept) == 200
    for i, array in enumerate(kept):
        np.testing.assert_array_equal(array, data[i], err_msg=f"element {i}")
        # Copied out of the region into a buffer of its own, as off the socket: no second copy
        # into numpy, and the caller's to change.
        assert type(array.base).__name__ == "TensorBuffer"
        assert array.flags.writeable
        array += 1
    np.testing.assert_array_equal(np.stack(kept), data + 1)


def test_arrays_kept_while_the_region_is_reused_stay_intact(servers):
    # 1,600 images of 48 KiB are 75 MiB, more than a region's 64 MiB, so the region's places
    # are written again and again while the reader keeps every third image. No kept image may
    # change.
    data = images(1600)
    kept = {}
    for i, array in enumerate(read(servers, data, "shm-kept")):
        assert array[0, 0, 0] == i * 100_000, f"element {i} arrived as {array[0, 0, 0]}"
        if i % 3 == 0:
            kept[i] = array
    assert len(kept) == 534
    for i, array in kept.items():
        np.testing.assert_array_equal(array, data[i], err_msg=f"element {i}")


def test_tuples_and_tensors_of_every_size_arrive_whole(servers):
    # Parts under the region's 4 KiB follow their frame on the socket; larger ones go through
    # the region; tuples travel in the frame itself.
    sizes = [1, 1000, 1024, 4096, 4097, 16384, 300_000]
    for n in sizes:
        data = np.arange(8 * n, dtype=np.int32).reshape(8, n)
        got = list(read(servers, data, f"shm-size-{n}"))
        np.testing.assert_array_equal(np.stack(got), data, err_msg=f"{n} int32s")
    pairs = Dataset.from_tensor_slices((images(20), np.arange(20))).apply(
        sluice.distribute("parallel_epochs", servers.dispatcher.address, job_name="shm-pairs")
    )
    got = list(pairs)
    assert [int(label) for _, label in got] == list(range(20))
    np.testing.assert_array_equal(np.stack([np.asarray(x) for x, _ in got]), images(20))


def test_a_worker_told_not_to_share_memory_serves_over_the_socket():
    # In this process, so that a region it made would be mapped here too.
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig())
    worker = sluice.WorkerServer(
        sluice.WorkerConfig(dispatcher.target, shared_memory=False)
    )
    try:
        data = images(200)
        ds = Dataset.from_tensor_slices(data).apply(
            sluice.distribute("parallel_epochs", dispatcher.target, job_name="shm-off")
        )
        got = []
        for i, array in enumerate(ds):
            got.append(np.asarray(array))
            if i == 100:
                assert fetch_regions() == 0, "a region, though the worker was told not to"
        np.testing.assert_array_equal(np.stack(got), data)
    finally:
        worker.stop()
        dispatcher.stop()
