"""``TensorSpec``: the static type of one tensor component of an element."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


class TensorSpec:
    """A component's dtype and shape; ``None`` in the shape is an unknown dimension.

    ``dtype`` is a numpy dtype, or ``"string"`` for byte strings (elements give ``bytes``)::

        >>> from sluice.data import Dataset, TensorSpec
        >>> Dataset.range(3).batch(2).element_spec
        TensorSpec(shape=(None,), dtype=int64)
        >>> Dataset.range(3).element_spec == TensorSpec((), "int64")
        True
    """

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Tuple[Optional[int], ...], dtype: object) -> None:
        self.shape: Tuple[Optional[int], ...] = tuple(shape)
        self.dtype: object = _dtype(dtype)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TensorSpec)
            and self.shape == other.shape
            and self.dtype == other.dtype
        )

    def __hash__(self) -> int:
        return hash((self.shape, str(self.dtype)))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape!r}, dtype={self.dtype})"


def _dtype(dtype: object) -> object:
    if dtype in ("string", str, bytes):
        return "string"
    return np.dtype(dtype)  # type: ignore[call-overload]
