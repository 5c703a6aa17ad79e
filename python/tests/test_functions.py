"""Users' Python functions in pipelines: map, filter and flat_map of any callable, run in this
interpreter when a dataset is iterated here and after ``distribute``; how they travel
(cloudpickle, the user's modules by value); their exceptions raised again in the reader; and
element specs known from the first element."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import sluice
from sluice import _functions, _native
from sluice.data import AUTOTUNE, Dataset, TensorSpec
from sluice.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    PythonFunctionError,
)


def ints(ds: Dataset) -> list:
    return [int(x) for x in ds]


def test_a_lambda_maps_every_element():
    assert ints(Dataset.range(5).map(lambda x: x * x + 1)) == [1, 2, 5, 10, 17]


def test_a_closure_over_a_numpy_array_sees_the_array():
    weights = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)

    def project(x):
        return weights * x

    out = list(Dataset.range(3).map(project, num_parallel_calls=AUTOTUNE))
    want = weights * np.int64(2)  # elements arrive as numpy int64 scalars
    assert out[2].dtype == want.dtype and out[2].tolist() == want.tolist()


class Scale:
    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


def test_a_callable_object_is_called_with_its_state():
    assert ints(Dataset.range(4).map(Scale(7), num_parallel_calls=2)) == [0, 7, 14, 21]


def test_a_tuple_element_is_passed_as_positional_arguments():
    ds = Dataset.from_tensor_slices(([1, 2, 3], [10, 20, 30])).map(lambda a, b: (b - a, a))
    assert [(int(d), int(a)) for d, a in ds] == [(9, 1), (18, 2), (27, 3)]


def test_a_dict_element_is_passed_as_one_argument_and_a_dict_returned():
    ds = Dataset.from_tensor_slices({"x": [1, 2], "name": ["a", "b"]}).map(
        lambda d: {"x2": d["x"] * 2, "name": d["name"] + b"!"}
    )
    assert [(int(e["x2"]), e["name"]) for e in ds] == [(2, b"a!"), (4, b"b!")]


def test_filter_keeps_the_elements_its_predicate_accepts():
    ds = Dataset.from_tensor_slices(([1, 2, 3, 4], [5.0, 6.0, 7.0, 8.0]))
    kept = ds.filter(lambda a, b: a % 2 == 0)
    assert [(int(a), float(b)) for a, b in kept] == [(2, 6.0), (4, 8.0)]
    assert kept.element_spec == (TensorSpec((), "int64"), TensorSpec((), "float64"))
    assert ints(Dataset.range(6).filter("is_even")) == [0, 2, 4]


def test_flat_map_of_a_dataset_and_of_a_list():
    assert ints(Dataset.range(1, 4).flat_map(lambda n: Dataset.range(int(n)))) == [
        0, 0, 1, 0, 1, 2,
    ]
    assert ints(Dataset.range(3).flat_map(lambda x: [x] * int(x))) == [1, 2, 2]
    rows = Dataset.range(2).flat_map(lambda x: np.arange(4).reshape(2, 2) + x)
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [1, 2], [3, 4]]


def test_output_signature_gives_the_spec_up_front_and_otherwise_the_first_element_does():
    sig = (TensorSpec((None,), "float32"), TensorSpec((), "string"))
    given = Dataset.range(3).map(
        lambda x: (np.ones(int(x), np.float32), b"s"), output_signature=sig
    )
    assert given.element_spec == sig
    inferred = Dataset.range(3).map(lambda x: (np.zeros((2, 3), np.uint8), x))
    assert inferred.element_spec == (TensorSpec((2, 3), "uint8"), TensorSpec((), "int64"))
    # A known part of the spec stays as it was.
    batched = Dataset.range(5).map(lambda x: x * 1.5).batch(2)
    assert batched.element_spec == TensorSpec((2,), "float64")
    with pytest.raises(FailedPreconditionError, match="output_signature"):
        Dataset.range(0).map(lambda x: x).element_spec
    with pytest.raises(InvalidArgumentError, match="TensorSpec"):
        Dataset.range(3).map(lambda x: x, output_signature=(np.int64,))


def test_a_builtin_exception_is_raised_again_with_its_type_message_and_traceback():
    def parse(x):
        return int(b"not a number")

    with pytest.raises(ValueError) as raised:
        list(Dataset.range(3).map(parse))
    e = raised.value
    assert isinstance(e, PythonFunctionError) and isinstance(e, sluice.errors.OpError)
    assert (e.type_module, e.type_name) == ("builtins", "ValueError")
    assert e.function.endswith("parse")
    assert str(e).startswith("ValueError: invalid literal for int()")
    assert "in parse" in e.remote_traceback and "in parse" in str(e)
    assert "test_functions.py" in e.remote_traceback

    with pytest.raises(KeyError):
        list(Dataset.range(3).filter(lambda x: {}["missing"]))


class NotReady(Exception):
    pass


def test_a_user_defined_exception_keeps_its_name_and_traceback():
    def check(x):
        if x == 2:
            raise NotReady(f"element {int(x)} is not ready")
        return x

    it = iter(Dataset.range(5).map(check))
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(PythonFunctionError) as raised:
        next(it)
    e = raised.value
    assert not isinstance(e, NotReady)  # only builtin classes are resolved
    assert (e.type_module, e.type_name) == (__name__, "NotReady")
    assert str(e).startswith("NotReady: element 2 is not ready")
    assert 'raise NotReady(f"element {int(x)} is not ready")' in e.remote_traceback


def test_a_pickle_of_other_versions_is_refused_naming_both():
    p = _functions.pickle_function(lambda x: x)
    native = Dataset.range(3)._native.py_function(
        _functions.KIND_MAP, p.pickled, p.name, "2.7", "0.1", 0, None
    )
    with pytest.raises(FailedPreconditionError, match=r"Python 2\.7 with cloudpickle 0\.1"):
        list(Dataset(native))


def test_what_is_not_a_function_is_refused_at_the_call():
    with pytest.raises(InvalidArgumentError, match="callable"):
        Dataset.range(3).map(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="num_parallel_calls"):
        Dataset.range(3).map(lambda x: x, num_parallel_calls=0)
    with pytest.raises(InvalidArgumentError, match="not an element"):
        list(Dataset.range(3).map(lambda x: object()))


def test_a_map_after_distribute_runs_in_the_reader(cluster):
    offset = np.int64(100)
    service = Dataset.range(6).map("square").apply(
        sluice.distribute("distributed_epoch", cluster.target)
    )
    ds = service.map(lambda x: x + offset).filter(lambda x: x % 2 == 0)
    with pytest.raises(FailedPreconditionError, match="output_signature"):
        service.map(lambda x: x).element_spec
    assert sorted(ints(ds)) == [100, 104, 116]
    shaped = service.map(lambda x: np.full(3, x, np.int32))
    assert [r.tolist() for r in sorted(shaped, key=lambda r: int(r[0]))][:2] == [
        [0, 0, 0],
        [1, 1, 1],
    ]
    assert shaped.element_spec == TensorSpec((3,), "int32")


def test_an_exception_after_distribute_is_raised_in_the_reader(cluster):
    service = Dataset.range(4).apply(sluice.distribute("parallel_epochs", cluster.target))

    def fail(x):
        raise ZeroDivisionError("division by zero in the reader")

    with pytest.raises(ZeroDivisionError) as raised:
        list(service.map(fail))
    assert raised.value.type_name == "ZeroDivisionError"
    assert "in fail" in raised.value.remote_traceback


def test_a_function_of_a_module_only_the_client_has_still_loads_without_it(tmp_path):
    name = f"client_only_{uuid.uuid4().hex}"
    source = tmp_path / "src"
    source.mkdir()
    (source / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            OFFSET = 1

            def helper(x):
                return x + OFFSET

            def scale(x):
                return np.int64(helper(x) * 2)
            """
        )
    )
    sys.path.insert(0, str(source))
    try:
        module = __import__(name)
        pickled = _functions.pickle_function(module.scale)
        assert ints(Dataset.range(3).map(module.scale)) == [2, 4, 6]
    finally:
        sys.path.remove(str(source))
        sys.modules.pop(name, None)
    # The registration that pickled it by value is undone.
    assert name not in _functions.cloudpickle.list_registry_pickle_by_value()
    (source / f"{name}.py").unlink()
    # What a worker sees: a fresh interpreter without the module.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from sluice import _functions; "
            "f = _functions.load_function(sys.stdin.buffer.read()); "
            "print(int(f(3)), f.__code__.co_filename.endswith('.py'))",
        ],
        input=pickled.pickled,
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr.decode()
    # The function, and the file name its code was written in (which cloudpickle 3.1.3 and
    # later replace with "<dynamic-code>"), for the worker's tracebacks.
    assert loaded.stdout.decode().strip() == "8 True"
    assert pickled.python_version == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert pickled.name == f"{name}.scale"


def test_from_dataset_id_takes_the_callers_spec_for_a_python_output(cluster):
    # Registered with a Python function whose output spec is unknown; nothing runs it here.
    ds = Dataset.range(3).map(lambda x: x * 2)
    dataset_id = sluice.register_dataset(cluster.target, ds)
    unknown = sluice.from_dataset_id("parallel_epochs", cluster.target, dataset_id)
    with pytest.raises(FailedPreconditionError, match="output_signature"):
        unknown.element_spec
    given = sluice.from_dataset_id(
        "parallel_epochs", cluster.target, dataset_id, element_spec=TensorSpec((), "int64")
    )
    assert given.element_spec == TensorSpec((), "int64")


def test_a_partial_of_a_function_pickles_with_its_arguments():
    import functools

    def add(x, y):
        return x + y

    assert ints(Dataset.range(3).map(functools.partial(add, y=np.int64(5)))) == [5, 6, 7]
