"""Users' Python functions in pipelines: how one is shipped, and how it is called.

The same rules hold wherever a function runs: in a worker's executor processes (ops before
``distribute``) and in the reader's own interpreter (ops after it, and datasets iterated
locally). A function goes as cloudpickle bytes with the Python minor version and cloudpickle
version that wrote them, since a pickle loads only under those.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List

import cloudpickle

# `PyFunctionKind` in the dataset definition.
KIND_MAP = 1
KIND_FILTER = 2
KIND_FLAT_MAP = 3

KIND_NAMES = {KIND_MAP: "map", KIND_FILTER: "filter", KIND_FLAT_MAP: "flat_map"}


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


def call(kind: int, fn: Callable[..., Any], element: Any) -> List[Any]:
    """The outputs of ``fn`` on ``element`` for an op of ``kind``: one for a map, none or the
    element itself for a filter, every element of what a flat_map returns.

    A tuple element is passed as positional arguments, as tf.data does; anything else as one.
    """
    result = fn(*element) if isinstance(element, tuple) else fn(element)
    if kind == KIND_MAP:
        return [result]
    if kind == KIND_FILTER:
        return [element] if _truth(result) else []
    if kind == KIND_FLAT_MAP:
        return list(result)
    raise ValueError(f"unknown Python function kind {kind}")


def _truth(value: Any) -> bool:
    """A filter's verdict: a bool, or a scalar (numpy or not) that converts to one."""
    if getattr(value, "shape", ()) not in ((), None):
        raise ValueError(
            f"a filter function must return a scalar bool, got an array of shape {value.shape}"
        )
    return bool(value)
