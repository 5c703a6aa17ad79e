"""numpy values as the native module takes tensors: ``(dtype name, shape, data)``.

The one conversion every path uses (dataset sources, feature defaults, users' functions'
outputs), below the modules that use it.
"""

from __future__ import annotations

from typing import Any

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


def tensor_parts(value: Any) -> "tuple[str, list[int], Any]":
    """(Sluice dtype name, shape, little-endian C-order bytes or a list of bytes)."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    shape = [int(d) for d in array.shape]
    if array.dtype.kind in "SUO":
        flat = [to_bytes(v) for v in array.reshape(-1).tolist()]
        return "string", shape, flat
    name = array.dtype.name
    if name not in DTYPES:
        raise InvalidArgumentError(
            f"unsupported dtype {array.dtype}; Sluice tensors are one of {sorted(DTYPES)} "
            "or strings"
        )
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return name, shape, data.tobytes()


def to_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise InvalidArgumentError(f"a string tensor holds str or bytes, got {type(value).__name__}")
