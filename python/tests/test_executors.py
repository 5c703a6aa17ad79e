"""A worker's Python executors, through real servers: functions run in executor processes of
the worker's interpreter, in parallel, and a failing or dying function costs its epoch an
error, never the worker.

The pipelines are built with ``Dataset.map``, ``filter`` and ``flat_map``, as users write them.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import sys
import time
import uuid
from typing import Any, Callable, Iterator, List, Optional

import cloudpickle
import numpy as np
import pytest

import sluice
from sluice import _functions, _native
from sluice.data import Dataset
from sluice.errors import OpError, PythonFunctionError

KIND_MAP = _functions.KIND_MAP
KIND_FILTER = _functions.KIND_FILTER
KIND_FLAT_MAP = _functions.KIND_FLAT_MAP


def with_python(
    ds: Dataset,
    kind: int,
    fn: Callable[..., Any],
    python_version: str,
    cloudpickle_version: str,
) -> Dataset:
    """``ds`` with a Python op of ``kind`` recorded as pickled under other versions."""
    p = _functions.pickle_function(fn)
    return Dataset(
        ds._native.py_function(kind, p.pickled, p.name, python_version, cloudpickle_version, 0, None)
    )


class Service:
    def __init__(self, python_executors: Optional[int] = 2) -> None:
        self.dispatcher = sluice.DispatchServer(sluice.DispatcherConfig())
        self.worker = sluice.WorkerServer(
            sluice.WorkerConfig(self.dispatcher.target, python_executors=python_executors)
        )

    def read(self, ds: Dataset, mode: str = "parallel_epochs") -> List[Any]:
        return list(ds.apply(sluice.distribute(mode, self.dispatcher.target)))

    def stop(self) -> None:
        self.worker.stop()
        self.dispatcher.stop()


@pytest.fixture
def service() -> Iterator[Service]:
    s = Service()
    yield s
    s.stop()


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_a_lambda_and_a_closure_over_an_array_run_on_the_workers_with_exact_outputs(service, mode):
    ds = Dataset.range(10).map(lambda x: x * x + 1)
    assert sorted(int(x) for x in service.read(ds, mode)) == [x * x + 1 for x in range(10)]
    weights = np.linspace(0.0, 1.0, 5, dtype=np.float32)
    ds = Dataset.range(6).map(lambda x: weights * np.float32(x))
    out = sorted(service.read(ds, mode), key=lambda a: float(a[-1]))
    assert len(out) == 6
    for x, row in enumerate(out):
        np.testing.assert_array_equal(row, weights * np.float32(x))


def test_outputs_of_every_dtype_and_layout_arrive_with_their_values(service):
    # An executor hands a returned array's own buffer to the encoder: views, reversed strides,
    # big-endian and Fortran-ordered arrays must arrive as their values, in C order.
    image = np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)

    def layouts(i: Any) -> Any:
        k = int(i)
        return (
            image[:, ::-1] + np.uint8(k),
            np.arange(6, dtype=">i4").reshape(2, 3) * k,
            np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)) + k,
            image.astype(np.float32)[::2, ::2] * np.float32(k),
            np.array([k % 2 == 0, True, False]),
            np.full((300, 300), k, dtype=np.int16),
        )

    out = sorted(service.read(Dataset.range(4).map(layouts)), key=lambda t: int(t[5][0, 0]))
    assert len(out) == 4
    for k, got in enumerate(out):
        for value, want in zip(got, layouts(k)):
            assert value.shape == want.shape
            assert value.dtype == want.dtype.newbyteorder("=")
            np.testing.assert_array_equal(value, want)


def test_a_function_of_a_module_only_the_client_has_runs_on_the_workers(service, tmp_path):
    """The executors' interpreter cannot import the module (it is on no path of theirs): the
    function and its module-level helper travel by value."""
    name = f"client_only_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "import numpy as np\n\nOFFSET = 5\n\n"
        "def helper(x):\n    return x + OFFSET\n\n"
        "def scale(x):\n    return np.int64(helper(x) * 2)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
        ds = Dataset.range(4).map(module.scale)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    assert sorted(int(x) for x in service.read(ds, "distributed_epoch")) == [10, 12, 14, 16]


def test_a_closure_over_an_array_gets_tuples_as_arguments_and_returns_dicts(service):
    table = np.arange(10, dtype=np.int32) * 3
    pairs = Dataset.range(4).map(lambda x: (x, table[x]))
    ds = pairs.map(lambda x, y: {"x": x, "y": y, "image": np.full((2, 2), y)})
    out = service.read(ds, "distributed_epoch")
    assert [int(e["y"]) for e in out] == [0, 3, 6, 9]
    assert [int(e["x"]) for e in out] == [0, 1, 2, 3]
    np.testing.assert_array_equal(out[3]["image"], np.full((2, 2), 9, dtype=np.int32))


def test_filter_and_flat_map_run_on_the_workers(service):
    evens = Dataset.range(10).filter(lambda x: x % 2 == 0)
    repeated = evens.flat_map(lambda x: [x] * int(x // 2))
    assert [int(x) for x in service.read(repeated)] == [2, 4, 4, 6, 6, 6, 8, 8, 8, 8]


def test_one_callable_as_a_filter_and_as_a_map_keeps_both_meanings(service):
    by_three = lambda x: x % 3 == 0  # noqa: E731 - one object, pickled twice alike
    ds = Dataset.range(10).filter(by_three).map(by_three)
    assert [bool(x) for x in service.read(ds)] == [True, True, True, True]


def test_a_raising_function_fails_the_epoch_with_its_type_and_message(service):
    def check(x):
        if x == 3:
            raise ValueError(f"element {x} is bad")
        return x

    ds = Dataset.range(10).map(check)
    with pytest.raises(ValueError) as info:
        service.read(ds)
    e = info.value
    assert isinstance(e, PythonFunctionError)
    assert (e.type_module, e.type_name) == ("builtins", "ValueError")
    assert str(e).startswith("ValueError: element 3 is bad")
    assert 'raise ValueError(f"element {x} is bad")' in e.remote_traceback
    assert service.worker.address in str(e)
    assert [int(x) for x in service.read(Dataset.range(3).map(check))] == [
        0,
        1,
        2,
    ]


def test_an_output_of_an_unsupported_type_is_an_error_naming_it(service):
    ds = Dataset.range(2).map(lambda x: object())
    with pytest.raises(OpError, match="builtins.object"):
        service.read(ds)


def test_an_executor_that_exits_fails_its_epoch_and_the_worker_serves_the_next_job(service):
    def die_on_5(x):
        if x == 5:
            os._exit(1)
        return x

    with pytest.raises(OpError, match=r"executor process \(pid \d+\) exited with status 1"):
        service.read(Dataset.range(10).map(die_on_5))
    ds = Dataset.range(20).map(lambda x: -x)
    assert [int(x) for x in service.read(ds)] == [-x for x in range(20)]


def test_a_dying_function_costs_only_its_own_job_while_another_runs_beside_it(service):
    """Calls of every job share the executors, a second call queued behind each running one:
    the call that kills its executor fails its own epoch, and the other job's calls that were
    queued behind it run on the new executor, each exactly once."""
    import threading

    def die_on_50(x):
        if x == 50:
            os._exit(1)
        return x

    others: List[Any] = []
    failures: List[BaseException] = []

    def read_other() -> None:
        try:
            others.extend(service.read(Dataset.range(400).map(lambda x: x + 1)))
        except BaseException as e:  # reported below
            failures.append(e)

    reader = threading.Thread(target=read_other)
    reader.start()
    with pytest.raises(OpError, match=r"executor process \(pid \d+\) exited with status 1"):
        service.read(Dataset.range(200).map(die_on_50))
    reader.join(timeout=120)
    assert not reader.is_alive() and not failures, failures
    assert [int(x) for x in others] == [x + 1 for x in range(400)]


def test_a_function_pickled_by_another_python_is_refused_naming_both_versions(service):
    ds = with_python(Dataset.range(3), KIND_MAP, lambda x: x, "3.99", "0.0.1")
    with pytest.raises(OpError) as info:
        service.read(ds)
    text = str(info.value)
    assert "Python 3.99 with cloudpickle 0.0.1" in text
    here = f"Python {_functions.python_version()} with cloudpickle {_functions.cloudpickle_version()}"
    assert here in text


def test_calls_run_in_parallel_across_the_executors(service, tmp_path):
    barrier = pathlib.Path(tmp_path)

    def meet(x):
        # Each call arrives, then waits for the other: both return only if they run at once.
        (barrier / f"arrived-{int(x)}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while len(list(barrier.glob("arrived-*"))) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the other call never ran alongside this one")
            time.sleep(0.01)
        return np.int64(os.getpid())

    pids = [int(p) for p in service.read(Dataset.range(2).map(meet))]
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_a_worker_without_executors_refuses_python_functions():
    s = Service(python_executors=0)
    try:
        with pytest.raises(OpError, match="has no Python executors"):
            s.read(Dataset.range(3).map(lambda x: x))
    finally:
        s.stop()


def test_a_missing_interpreter_fails_the_worker_naming_it():
    d = sluice.DispatchServer(sluice.DispatcherConfig())
    try:
        with pytest.raises(OpError, match="/nonexistent/python3"):
            _native.WorkerServer(
                d.target, "127.0.0.1", 0, [], python="/nonexistent/python3", python_executors=1
            )
    finally:
        d.stop()


def test_a_negative_number_of_executors_is_refused():
    with pytest.raises(sluice.errors.InvalidArgumentError, match="python_executors"):
        sluice.WorkerServer(sluice.WorkerConfig("127.0.0.1:1", python_executors=-1))
