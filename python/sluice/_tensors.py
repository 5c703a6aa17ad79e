"""numpy values as the native module takes tensors: ``(dtype name, shape, data)``.

The one conversion every path uses (dataset sources, feature defaults, users' functions'
outputs), below the modules that use it.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional

import numpy as np

from sluice.errors import InvalidArgumentError

# numpy dtypes Sluice tensors have, by numpy name.
DTYPES = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
}


# Each dtype above, in both byte orders, to its name. numpy 2's ``dtype.name`` is computed in
# Python on every access (7 µs, more than a small function's own call): this is a dict lookup.
_NAMES: Dict[np.dtype, str] = {}
for _name in DTYPES:
    for _order in "<>":
        _NAMES[np.dtype(_name).newbyteorder(_order)] = _name

LITTLE_ENDIAN = sys.byteorder == "little"


def dtype_name(dtype: np.dtype) -> Optional[str]:
    """The Sluice name of a numeric numpy dtype; ``None`` for any other."""
    return _NAMES.get(dtype)


def little_endian_c_order(array: np.ndarray) -> np.ndarray:
    """``array`` itself when it is already little-endian and C-contiguous (the usual case, and
    free), else a copy that is."""
    little = array.dtype.isnative if LITTLE_ENDIAN else array.dtype.byteorder == "<"
    if little and array.flags.c_contiguous:
        return array
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def tensor_parts(value: Any) -> "tuple[str, list[int], Any]":
    """(Sluice dtype name, shape, a little-endian C-order array or a list of bytes).

    The array itself rather than its ``tobytes()``: the native side copies it once, and a large
    one (a definition's constant) into a buffer that remembers its digest, so a dataset
    registered again (each ``distribute`` or ``register_dataset`` of it) is not hashed again."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    shape = list(array.shape)
    if array.dtype.kind in "SUO":
        flat = [to_bytes(v) for v in array.reshape(-1).tolist()]
        return "string", shape, flat
    name = dtype_name(array.dtype)
    if name is None:
        raise InvalidArgumentError(
            f"unsupported dtype {array.dtype}; Sluice tensors are one of {sorted(DTYPES)} "
            "or strings"
        )
    return name, shape, little_endian_c_order(array)


def to_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise InvalidArgumentError(f"a string tensor holds str or bytes, got {type(value).__name__}")
