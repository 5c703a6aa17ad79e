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
        end = time.perf_counter() + 0.025
        while time.perf_counter() < end:
            pass
        return (x, np.int64(os.getpid()))

    out = service.read(Dataset.range(30).map(slow))
    assert [int(x) for x, _ in out] == list(range(30))
    # Calls of 25 ms are past a batch's aim (20 ms): each goes alone, so the two executors
    # share even the first elements rather than one taking a batch of them.
    pids = [int(pid) for _, pid in out]
    assert longest_run(pids) < 8, pids


def test_a_map_of_large_outputs_keeps_calls_one_by_one(service):
    import time

    def large(x):
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        return (np.full(384 * 1024, x, dtype=np.float32), np.int64(os.getpid()))

    out = service.read(Dataset.range(40).map(large))
    assert [int(a[0]) for a, _ in out] == list(range(40))
    assert all(a.shape == (384 * 1024,) and int(a[-1]) == i for i, (a, _) in enumerate(out))
    # 5 ms calls would go four to a batch, but each returns 1.5 MiB: past a batch's aim of
    # bytes (1 MiB), so each goes alone.
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


#: One array a function writes its every result into: reused, as a careful user's is.
_REUSED = np.zeros((64, 64, 3), np.float32)


def reuse_output(x):
    _REUSED[...] = x
    return _REUSED


def test_a_function_reusing_its_output_array_delivers_each_calls_values(service):
    # A batch's results are encoded one by one, each right after its call: the next call
    # overwriting the array cannot change an element already produced.
    out = service.read(Dataset.range(2000).map(reuse_output))
    assert len(out) == 2000
    for i, array in enumerate(out):
        assert array.shape == (64, 64, 3)
        assert (array == i).all(), f"element {i} holds {array.flat[0]}"


def filled(x):
    return np.full(4096, x, np.int64)


def test_results_the_worker_keeps_stay_intact_while_later_batches_reuse_the_region(service):
    # The worker reads a batch's results where the executor wrote them, lending the reply slot
    # until the results are dropped. A cache keeps every result of the first epoch while the
    # later batches run: more batches (32 KiB each result, about 30 to a batch) than the
    # region has slots, so some results are lent and the rest copied out, and none may change
    # when a slot is written again.
    out = service.read(Dataset.range(600).map(filled).cache().repeat(3))
    assert len(out) == 1800
    for i, array in enumerate(out):
        assert array.shape == (4096,)
        assert (array == i % 600).all(), f"element {i} holds {array[0]} and {array[-1]}"


def sized(x):
    # Mostly small results, and every ninth one past the executors' 16 MiB reply slots; the
    # large ones are the next function's inputs, past the 4 MiB request slots.
    n = (20 << 20) if x % 9 == 8 else 48 << 10
    return np.full(n, x % 251, np.uint8)


def test_results_and_inputs_too_large_for_the_shared_region_go_through_the_pipes(service):
    ds = Dataset.range(40).map(sized).map(lambda a: (a[::-1].copy(), np.int64(a.size)))
    got = service.read(ds)
    assert len(got) == 40
    for x, (array, size) in enumerate(got):
        want = sized(x)
        assert int(size) == want.size
        np.testing.assert_array_equal(array, want)


def _executor_with_region(env_value=None):
    """An executor started as a worker starts it, with a region of two 64 KiB request slots
    and two 256 KiB reply slots (or `env_value` as its variable), and the region's mapping."""
    import mmap
    import subprocess
    import sys

    fd = os.memfd_create("sluice-test-region")
    size = 2 * (64 << 10) + 2 * (256 << 10)
    os.ftruncate(fd, size)
    region = mmap.mmap(fd, size)
    env = dict(os.environ)
    env["SLUICE_EXECUTOR_REGION"] = env_value or f"{fd}:2:{64 << 10}:{256 << 10}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice._executor"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=[fd],
        env=env,
    )
    os.close(fd)
    return proc, region


def test_an_executor_answers_a_batch_in_the_shared_region_and_says_where():
    import json
    import struct

    from sluice import _executor, _functions, _native

    proc, region = _executor_with_region()
    try:
        kind, hello = _executor._read_frame(proc.stdout)
        assert kind == _executor.HELLO and json.loads(hello)["shared"] is True
        fn = _functions.pickle_function(lambda a: a * 2).pickled
        _executor._write_frame(proc.stdin, _executor.LOAD, struct.pack("<QB", 7, 1) + fn)
        assert _executor._read_frame(proc.stdout)[0] == _executor.LOADED
        inputs = [np.arange(i, i + 3000, dtype=np.float32) for i in range(5)]
        body = _native.encode_elements([_functions.output_parts(a) for a in inputs])
        # Request slot 1 starts after slot 0's 64 KiB.
        region[64 << 10 : (64 << 10) + len(body)] = body
        _executor._write_frame(
            proc.stdin, _executor.BATCH_SHARED, struct.pack("<QBI", 7, 1, len(body))
        )
        kind, where = _executor._read_frame(proc.stdout)
        assert kind == _executor.RESULTS_SHARED
        slot, length = struct.unpack("<BI", where)
        assert slot == 1
        at = 2 * (64 << 10) + (256 << 10)
        results = bytes(region[at : at + length])
        count, _nanos = struct.unpack_from("<IQ", results)
        assert count == 5
        pos = 12
        for a in inputs:
            result_kind, n = struct.unpack_from("<BI", results, pos)
            assert result_kind == _executor.OUTPUTS
            # An OUTPUTS body is laid out as a batch's: its one output decodes as an element.
            (out,) = _native.decode_elements(results[pos + 5 : pos + 5 + n])
            np.testing.assert_array_equal(out, a * 2)
            pos += 5 + n
        assert pos == length
    finally:
        proc.kill()
        proc.wait()
        region.close()


def test_an_executor_that_cannot_map_its_region_says_so_and_uses_its_pipes():
    import json

    from sluice import _executor

    proc, region = _executor_with_region(env_value="not-a-region")
    try:
        kind, hello = _executor._read_frame(proc.stdout)
        assert kind == _executor.HELLO and json.loads(hello)["shared"] is False
    finally:
        proc.kill()
        _, err = proc.communicate()
        region.close()
    assert b"no shared region" in err and b"SLUICE_EXECUTOR_REGION" in err
