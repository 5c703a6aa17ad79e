"""A worker's Python executors take a cheap function's elements in batches (one frame each way
per batch, its size chosen from the measured cost per element): invisible to the user. The
outputs keep their input order, an element that raises is the one reported with the elements
before it delivered, an executor that dies mid-batch fails the element that kills it, and
numpy arrays come back bit for bit.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

import sluice
from sluice.data import Dataset
from sluice.errors import OpError, PythonFunctionError


class Service:
    def __init__(self) -> None:
        self.dispatcher = sluice.DispatchServer(sluice.DispatcherConfig())
        self.worker = sluice.WorkerServer(
            sluice.WorkerConfig(self.dispatcher.target, python_executors=2)
        )

    def iterate(self, ds: Dataset) -> Iterator[Any]:
        return iter(ds.apply(sluice.distribute("parallel_epochs", self.dispatcher.target)))

    def read(self, ds: Dataset) -> List[Any]:
        return list(self.iterate(ds))

    def read_until_error(self, ds: Dataset) -> Tuple[List[Any], BaseException]:
        """The elements read before the first error, and the error."""
        got: List[Any] = []
        try:
            for e in self.iterate(ds):
                got.append(e)
        except Exception as e:  # noqa: BLE001 - returned to the test
            return got, e
        raise AssertionError(f"no error after {len(got)} elements")

    def stop(self) -> None:
        self.worker.stop()
        self.dispatcher.stop()


@pytest.fixture
def service() -> Iterator[Service]:
    s = Service()
    yield s
    s.stop()


def longest_run(values: List[int]) -> int:
    """The longest run of equal consecutive values."""
    longest, run = 1, 1
    for a, b in zip(values, values[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    return longest


def test_a_cheap_map_runs_in_batches_and_keeps_its_order(service):
    n = 6000
    out = service.read(Dataset.range(n).map(lambda x: (x * 3, np.int64(os.getpid()))))
    assert [int(x) for x, _ in out] == [3 * x for x in range(n)]
    pids = [int(pid) for _, pid in out]
    assert len(set(pids)) == 2, "both executors took calls"
    # One by one, two executors fed from one queue alternate every element or few; a batch is
    # a run of consecutive elements on one executor.
    assert longest_run(pids) >= 16, f"no batch of 16 in {n} cheap calls"


def test_a_slow_map_keeps_calls_one_by_one(service):
    import time

    def slow(x):
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        return (x, np.int64(os.getpid()))

    out = service.read(Dataset.range(60).map(slow))
    assert [int(x) for x, _ in out] == list(range(60))
    # Calls of 4 ms are past a batch's aim: each goes alone, so the two executors share even
    # the first elements rather than one taking a batch of them.
    pids = [int(pid) for _, pid in out]
    assert longest_run(pids) < 8, pids


def test_filter_and_flat_map_are_batched_and_keep_their_order(service):
    n = 6000
    ds = Dataset.range(n).filter(lambda x: x % 3 == 0).flat_map(lambda x: [x, -x, x * 10])
    want = [v for x in range(0, n, 3) for v in (x, -x, x * 10)]
    assert [int(x) for x in service.read(ds)] == want


def test_an_error_mid_batch_reports_that_element_after_those_before_it(service):
    def check(x):
        if x == 2500:
            raise KeyError(f"element {x}")
        return x + 1

    got, error = service.read_until_error(Dataset.range(5000).map(check))
    # In order and none past it. (The stage yields every element before the error, see
    # `an_error_mid_batch_is_yielded_in_its_place_and_the_batch_goes_on` in the executor crate,
    # and `ignore_errors` below gets them all; a reader may see the task's error before the
    # last few elements the worker had buffered.)
    assert [int(x) for x in got] == [x + 1 for x in range(len(got))]
    assert len(got) <= 2500
    assert isinstance(error, KeyError) and isinstance(error, PythonFunctionError)
    assert (error.type_module, error.type_name) == ("builtins", "KeyError")
    assert "element 2500" in str(error)
    assert "raise KeyError" in error.remote_traceback


def test_ignore_errors_drops_only_the_elements_that_raised_in_a_batch(service):
    def every_hundredth_raises(x):
        if x % 100 == 7:
            raise ValueError(f"element {x}")
        return x

    ds = Dataset.range(3000).map(every_hundredth_raises).ignore_errors()
    assert [int(x) for x in service.read(ds)] == [x for x in range(3000) if x % 100 != 7]


def test_an_executor_that_dies_mid_batch_fails_the_element_that_killed_it(service):
    def die_on_2500(x):
        if x == 2500:
            os._exit(3)
        return x * 2

    got, error = service.read_until_error(Dataset.range(5000).map(die_on_2500))
    assert isinstance(error, OpError)
    assert "die_on_2500" in str(error)
    assert "exited with status 3" in str(error)
    # The elements before it come once each, in order (those of its batch ran twice, the
    # second time one by one, when the executor had died the first time).
    assert [int(x) for x in got] == [x * 2 for x in range(len(got))]
    assert len(got) <= 2500
    # The worker goes on, with batches again.
    out = service.read(Dataset.range(3000).map(lambda x: -x))
    assert [int(x) for x in out] == [-x for x in range(3000)]


def bit_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def make_arrays(i: int) -> Tuple[np.ndarray, np.ndarray]:
    """A 256x256x3 float32 image (768 KiB, past the size sent as a piece of its own) with NaNs
    of distinct payloads and a negative zero, whose bits a conversion would lose, and a block of
    int64s, both made from ``i``."""
    rng = np.random.default_rng(int(i))
    image = rng.standard_normal((256, 256, 3)).astype(np.float32)
    image.view(np.uint32)[0, 0, :] = 0x7FC00001 + np.uint32(i) + np.arange(3, dtype=np.uint32)
    image[1, 1, 1] = -0.0
    block = rng.integers(-(2**62), 2**62, size=(3, 5, 7), dtype=np.int64)
    return image, block


def views(image: np.ndarray, block: np.ndarray) -> Dict[str, np.ndarray]:
    """Contiguous, transposed, strided and reinterpreted views of the arrays."""
    return {
        "same": image,
        "transposed": image.transpose(2, 0, 1),
        "strided": image[::2, ::-3],
        "wide": image.astype(np.float64)[:, :, ::-1],
        "block": block[:, ::2].T,
        "bools": block > 0,
        "bytes": image[:4, :4].view(np.uint8),
    }


def test_large_and_strided_arrays_round_trip_bit_exactly_in_both_directions(service):
    # The arrays are made in an executor (out of it), then go into the next function (into an
    # executor) whose outputs are views of them (out again); the definition stays small.
    ds = Dataset.range(12).map(make_arrays).map(views)
    got = service.read(ds)
    assert len(got) == 12
    for i, out in enumerate(got):
        want = views(*make_arrays(i))
        assert sorted(out) == sorted(want)
        for key in want:
            bit_exact(out[key], want[key])
