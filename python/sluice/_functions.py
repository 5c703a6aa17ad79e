"""Users' Python functions in pipelines: how one is shipped, and how it is called.

The same rules hold wherever a function runs: in a worker's executor processes (ops before
``distribute``) and in the reader's own interpreter (ops after it, and datasets iterated
locally). A function goes as cloudpickle bytes with the Python minor version and cloudpickle
version that wrote them, since a pickle loads only under those.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import sys
import sysconfig
import threading
import traceback
import types
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

import cloudpickle
import numpy as np

from sluice._tensors import LITTLE_ENDIAN, dtype_name, tensor_parts

# `PyFunctionKind` in the dataset definition.
KIND_MAP = 1
KIND_FILTER = 2
KIND_FLAT_MAP = 3
KIND_INTERLEAVE = 4
KIND_TAKE_WHILE = 5
KIND_GENERATOR = 6
KIND_GROUP_REDUCE = 7

KIND_NAMES = {
    KIND_MAP: "map",
    KIND_FILTER: "filter",
    KIND_FLAT_MAP: "flat_map",
    KIND_INTERLEAVE: "interleave",
    KIND_TAKE_WHILE: "take_while",
    KIND_GENERATOR: "from_generator",
    KIND_GROUP_REDUCE: "group_by_window",
}


def python_version() -> str:
    """``major.minor`` of this interpreter, as a definition records it."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def cloudpickle_version() -> str:
    return str(cloudpickle.__version__)


def function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function, or its class's for a callable object."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(fn).__name__)}"


class Pickled(NamedTuple):
    """A function as a definition carries it."""

    pickled: bytes
    name: str
    python_version: str
    cloudpickle_version: str


def pickle_function(fn: Callable[..., Any]) -> Pickled:
    """``fn`` as cloudpickle bytes, with the versions that can load them.

    Lambdas, closures and callable objects go by value, as cloudpickle does. So do functions
    and classes of the user's own modules (any module that is neither the standard library, an
    installed package, nor sluice), and of the user's modules they refer to: a worker need not
    have those modules. The registration that makes cloudpickle do so is undone afterwards.
    """
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__name__}")
    with _registry_lock:
        registered = set(cloudpickle.list_registry_pickle_by_value())
        added = [m for m in _user_modules(fn) if m.__name__ not in registered]
        for module in added:
            cloudpickle.register_pickle_by_value(module)
        try:
            pickled = cloudpickle.dumps((_WITH_FILENAMES, fn, _code_filenames(fn)))
        finally:
            for module in added:
                cloudpickle.unregister_pickle_by_value(module)
    return Pickled(pickled, function_name(fn), python_version(), cloudpickle_version())


def load_function(pickled: bytes) -> Callable[..., Any]:
    """The function ``pickle_function`` pickled, with the file names of its code back."""
    loaded = cloudpickle.loads(pickled)
    if isinstance(loaded, tuple) and len(loaded) == 3 and loaded[0] == _WITH_FILENAMES:
        _, fn, filenames = loaded
        _restore_filenames(fn, filenames)
        return fn
    return loaded


# cloudpickle 3.1.3 and later write the file name of every code object it pickles by value as
# "<dynamic-code>", so that payloads do not depend on where a function was defined. A worker's
# traceback of the user's function would then name no file: the function travels with the file
# names of its code, keyed by qualified name and first line, and the executor puts them back.
_WITH_FILENAMES = "sluice.function-with-filenames/1"
_DYNAMIC_CODE = "<dynamic-code>"

CodeKey = Tuple[str, int]


def _code_key(code: types.CodeType) -> CodeKey:
    return (getattr(code, "co_qualname", code.co_name), code.co_firstlineno)


def _nested_codes(code: types.CodeType) -> Iterable[types.CodeType]:
    todo = [code]
    while todo:
        code = todo.pop()
        yield code
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _functions_reached(fn: Any, follow: Callable[[types.FunctionType], bool]) -> Iterable[Any]:
    """The functions ``fn`` reaches through closures, globals and classes, walking on from the
    functions ``follow`` accepts (bounded like ``_user_modules``)."""
    seen: Set[int] = set()
    todo: List[Any] = [fn]
    while todo and len(seen) < _MAX_VISITS:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            todo.extend([obj.func, *obj.args, *obj.keywords.values()])
        elif isinstance(obj, types.FunctionType):
            if follow(obj):
                yield obj
                todo.extend(_referenced(obj))
        elif isinstance(obj, (types.MethodType, type)) or callable(obj):
            todo.extend(_referenced(obj))


def _code_filenames(fn: Any) -> Dict[CodeKey, str]:
    """The file names of the code of the user's functions ``fn`` reaches."""
    def follow(f: types.FunctionType) -> bool:
        module = sys.modules.get(f.__module__ or "")
        return module is None or _is_user_module(module)

    names: Dict[CodeKey, str] = {}
    for f in _functions_reached(fn, follow):
        for code in _nested_codes(f.__code__):
            if not code.co_filename.startswith("<"):
                names.setdefault(_code_key(code), code.co_filename)
    return names


def _restore_filenames(fn: Any, names: Dict[CodeKey, str]) -> None:
    if not names:
        return

    def renamed(code: types.CodeType) -> types.CodeType:
        consts = tuple(renamed(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        filename = code.co_filename
        if filename == _DYNAMIC_CODE:
            filename = names.get(_code_key(code), filename)
        return code.replace(co_filename=filename, co_consts=consts)

    def follow(f: types.FunctionType) -> bool:
        return f.__code__.co_filename == _DYNAMIC_CODE

    for f in list(_functions_reached(fn, follow)):
        f.__code__ = renamed(f.__code__)


# cloudpickle's by-value registry is process-wide: one pickling at a time registers and
# unregisters, so threads pickling at once do not undo each other's registrations.
_registry_lock = threading.Lock()

# Objects looked at while collecting a function's modules at most: a bound on the walk through
# a large module's globals.
_MAX_VISITS = 10_000


def _user_modules(fn: Callable[..., Any]) -> List[types.ModuleType]:
    """The user's modules that ``fn`` needs: its own, and those of the functions, classes and
    modules its code refers to (through globals, closures and, for a callable object, its
    class), followed through functions of those modules in turn."""
    found: Dict[str, types.ModuleType] = {}
    seen: Set[int] = set()
    todo: List[Any] = [fn]
    while todo and len(seen) < _MAX_VISITS:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            if _is_user_module(obj):
                found.setdefault(obj.__name__, obj)
            continue
        if isinstance(obj, functools.partial):
            todo.extend([obj.func, *obj.args, *obj.keywords.values()])
            continue
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if module is None or not _is_user_module(module):
            if not isinstance(obj, (types.FunctionType, types.MethodType)) and callable(obj):
                todo.append(type(obj))  # a callable object of a user's class
            continue
        found.setdefault(module.__name__, module)
        todo.extend(_referenced(obj))
    return list(found.values())


def _referenced(obj: Any) -> Iterable[Any]:
    """What a function (its globals by name, its closure), a method, a class (its methods) or a
    callable object (its class) refers to."""
    if isinstance(obj, types.MethodType):
        return [obj.__func__, obj.__self__]
    if isinstance(obj, types.FunctionType):
        names: Set[str] = set()
        codes = [obj.__code__]
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        refs = [obj.__globals__[n] for n in names if n in obj.__globals__]
        for cell in obj.__closure__ or ():
            try:
                refs.append(cell.cell_contents)
            except ValueError:
                pass  # an empty cell
        return refs
    if isinstance(obj, type):
        return [v for v in vars(obj).values() if isinstance(v, (types.FunctionType, type))]
    return [type(obj)]


@functools.lru_cache(maxsize=None)
def _library_dirs() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for scheme_key in ("stdlib", "platstdlib"):
            try:
                dirs.add(sysconfig.get_path(scheme_key, vars={"base": prefix, "platbase": prefix}))
            except KeyError:
                pass
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _is_user_module(module: types.ModuleType) -> bool:
    """A module of the user's own: not built in, not the standard library, not an installed
    package, not sluice. ``__main__`` counts (cloudpickle pickles it by value anyway)."""
    name = module.__name__
    top = name.partition(".")[0]
    if name == "__main__":
        return True
    if top == "sluice" or top in sys.builtin_module_names:
        return False
    if top in getattr(sys, "stdlib_module_names", ()):
        return False
    path = getattr(module, "__file__", None)
    if not path:
        return False  # built in, or a namespace package
    real = os.path.realpath(path)
    if any(f"{os.sep}{d}{os.sep}" in real for d in ("site-packages", "dist-packages")):
        return False
    return not any(real.startswith(d) for d in _library_dirs())


def exception_parts(
    exc: BaseException, tb: Optional[types.TracebackType] = None
) -> Tuple[str, str, str, str]:
    """``(type module, type qualname, str(exc), traceback text)`` of an exception a user's
    function raised, as the reader raises it again; the traceback (``tb``, or the exception's
    own) starts at the user's code."""
    tb = tb if tb is not None else exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    kind = type(exc)
    text = "".join(traceback.format_exception(kind, exc, tb))
    return kind.__module__, kind.__qualname__, str(exc), text


def call(kind: int, fn: Callable[..., Any], element: Any) -> List[Any]:
    """The outputs of ``fn`` on ``element`` for an op of ``kind``: one for a map, none or the
    element itself for a filter or a take_while, every element of what a flat_map or an
    interleave's function returns.

    A tuple element is passed as positional arguments, as tf.data does; anything else as one.
    A generator's call gets ``(run token, start, count)`` and returns that chunk of the run.
    """
    if kind == KIND_GENERATOR:
        return _generator_chunk(fn, *element)
    result = fn(*element) if isinstance(element, tuple) else fn(element)
    if kind == KIND_MAP:
        return [result]
    if kind in (KIND_FILTER, KIND_TAKE_WHILE):
        return [element] if _truth(result) else []
    if kind in (KIND_FLAT_MAP, KIND_INTERLEAVE, KIND_GROUP_REDUCE):
        return list(result)
    raise ValueError(f"unknown Python function kind {kind}")


class Generator:
    """``from_generator``'s callable: ``generator(*args)``, pickled together."""

    def __init__(self, generator: Callable[..., Any], args: Tuple[Any, ...]) -> None:
        self.generator = generator
        self.args = args
        # Named as the generator in messages.
        target = generator if hasattr(generator, "__qualname__") else type(generator)
        self.__qualname__ = getattr(target, "__qualname__", type(generator).__name__)
        self.__module__ = getattr(target, "__module__", None) or "?"

    def __call__(self) -> Any:
        return self.generator(*self.args)


class GroupReduce:
    """``group_by_window``'s ``reduce_func`` run in Python: ``reduce_func(key, window)`` with
    the window's elements as a dataset."""

    def __init__(self, reduce_func: Callable[..., Any]) -> None:
        self.reduce_func = reduce_func
        target = reduce_func if hasattr(reduce_func, "__qualname__") else type(reduce_func)
        self.__qualname__ = getattr(target, "__qualname__", type(reduce_func).__name__)
        self.__module__ = getattr(target, "__module__", None) or "?"

    def __call__(self, key: Any, window: Tuple[Any, ...]) -> Any:
        from sluice.data import Dataset, TensorSpec

        def spec(e: Any) -> Any:
            if isinstance(e, tuple):
                return tuple(spec(x) for x in e)
            if isinstance(e, dict):
                return {k: spec(v) for k, v in e.items()}
            a = np.asarray(e)
            return TensorSpec(a.shape, "string" if a.dtype.kind in "SOU" else a.dtype)

        elements = list(window)
        signature = spec(elements[0]) if elements else TensorSpec((), "int64")
        ds = Dataset.from_generator(lambda: iter(elements), output_signature=signature)
        return self.reduce_func(key, ds)


# The generator runs this process is in the middle of, by (function, run token): the iterator
# and how many elements it gave. A few only: a run whose chunk went to another process starts
# again there and skips ahead.
_RUNS: "collections.OrderedDict[Tuple[int, int], Tuple[Any, int]]" = collections.OrderedDict()
_RUNS_LOCK = threading.Lock()
_MOST_RUNS = 64


def _generator_chunk(fn: Callable[[], Any], token: Any, start: Any, count: Any) -> List[Any]:
    """Elements ``start .. start + count`` of the generator run ``token`` (fewer at its end)."""
    key, start, count = (id(fn), int(token)), int(start), int(count)
    with _RUNS_LOCK:
        held = _RUNS.pop(key, None)
    if held is not None and held[1] == start:
        it = held[0]
    else:
        it = iter(fn())
        collections.deque(itertools.islice(it, start), maxlen=0)
    out = list(itertools.islice(it, count))
    if len(out) == count:
        with _RUNS_LOCK:
            _RUNS[key] = (it, start + count)
            while len(_RUNS) > _MOST_RUNS:
                _RUNS.popitem(last=False)
    return out


def _truth(value: Any) -> bool:
    """A filter's verdict: a bool, or a scalar (numpy or not) that converts to one."""
    if getattr(value, "shape", ()) not in ((), None):
        raise ValueError(
            f"a filter function must return a scalar bool, got an array of shape {value.shape}"
        )
    return bool(value)


def output_parts(value: Any) -> Any:
    """A function's output as the native side takes it: tuples and dicts kept, each leaf
    ``[dtype, shape, data]``. The same rule wherever the function ran; a value of another type
    (a list, ``None``, an object) is a ``TypeError`` naming it."""

    if isinstance(value, tuple):
        return tuple(output_parts(v) for v in value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(
                    f"a dict output of a Python function has str keys, got {type(key).__name__}"
                )
        return {k: output_parts(v) for k, v in value.items()}
    if isinstance(value, np.generic) and value.dtype.isnative and LITTLE_ENDIAN:
        # A numpy scalar (a small function's usual result), without making it an array.
        name = dtype_name(value.dtype)
        if name is not None:
            return [name, [], value.tobytes()]
    if isinstance(value, (np.ndarray, np.generic, bool, int, float, bytes, str)):
        # An array goes as itself, not its bytes: the native side copies it once.
        return list(tensor_parts(value))
    raise TypeError(
        f"a Python function's output must be a numpy array or scalar, an int, float, bool, "
        f"bytes or str, or a tuple or dict of them; got {type(value).__module__}."
        f"{type(value).__qualname__}"
    )
