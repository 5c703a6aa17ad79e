"""``sluice.io``: tf.io's feature specs for :meth:`sluice.data.Dataset.parse_example`, and
helpers to write TFRecord files of ``tf.train.Example`` records without TensorFlow.

A feature's dtype is ``int64``, ``float32`` or ``string`` (bytes): a numpy dtype or type
(``np.int64``, ``np.float32``, ``bytes``), its name, or a TensorFlow dtype (anything with a
``name`` such as ``tf.int64``)::

    >>> import numpy as np
    >>> import sluice
    >>> FixedLenFeature((), "int64")
    FixedLenFeature(shape=(), dtype='int64', default_value=None)
    >>> sluice.io.VarLenFeature("string")
    VarLenFeature(dtype='string')
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Sequence

import numpy as np

from sluice import _native
from sluice._tensors import tensor_parts
from sluice.errors import InvalidArgumentError

__all__ = [
    "FixedLenFeature",
    "TFRecordWriter",
    "VarLenFeature",
    "serialize_example",
]


def _feature_dtype(dtype: Any) -> str:
    """``int64``, ``float32`` or ``string`` for any way of naming them."""
    name = getattr(dtype, "name", None) if not isinstance(dtype, (str, type)) else None
    if name is None:
        if dtype in (bytes, str, np.bytes_, np.str_, object, "bytes", "string"):
            name = "string"
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = str(dtype)
    if name not in ("int64", "float32", "string"):
        raise InvalidArgumentError(
            f"a tf.train.Example feature is int64, float32 or string (bytes), got {dtype!r}"
        )
    return name


class FixedLenFeature(NamedTuple):
    """A feature with exactly ``prod(shape)`` values, parsed to an array of ``shape``.

    A record without it takes ``default_value`` (anything numpy makes an array of that shape
    from, or as many values flat); without a default such a record is an error naming the
    feature.
    """

    shape: Sequence[int]
    dtype: Any
    default_value: Any = None


class VarLenFeature(NamedTuple):
    """A feature with any number of values, parsed to a 1-D array of that record's values (empty
    when the record lacks it). It is a dense array, not tf's sparse tensor."""

    dtype: Any


def _feature_parts(name: str, feature: Any) -> "tuple[Any, ...]":
    """The tuple ``_native.Dataset.parse_example`` takes for one feature."""

    if isinstance(feature, VarLenFeature):
        return (name, True, _feature_dtype(feature.dtype), [], None)
    if not isinstance(feature, FixedLenFeature):
        raise InvalidArgumentError(
            f"feature '{name}' must be a sluice.io.FixedLenFeature or VarLenFeature, got "
            f"{type(feature).__name__}"
        )
    dtype = _feature_dtype(feature.dtype)
    shape = [int(d) for d in feature.shape]
    default = None
    if feature.default_value is not None:
        numpy_dtype = {"int64": np.int64, "float32": np.float32, "string": object}[dtype]
        default = tensor_parts(np.asarray(feature.default_value, dtype=numpy_dtype))
    return (name, False, dtype, shape, default)


def serialize_example(features: Dict[str, Any]) -> bytes:
    """A serialized ``tf.train.Example`` holding ``features``: integers become an int64 list,
    floats a float list, ``bytes``/``str`` a bytes list; arrays are flattened.

    >>> record = serialize_example({"label": 3, "xy": np.array([0.5, 1.5], np.float32)})
    >>> isinstance(record, bytes)
    True
    """

    parts = {}
    for name, value in features.items():
        array = np.asarray(value)
        if array.dtype.kind in "SUO":
            array = array.astype(object)
        parts[str(name)] = tensor_parts(array)
    return _native.serialize_example(parts)


class TFRecordWriter:
    """Writes records to a TFRecord file, plain or compressed as a whole (``"GZIP"``,
    ``"ZLIB"``) as TensorFlow writes them. Use it as a context manager, or call ``close()``: a
    compressed file is complete only once closed.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.tfrecord.gz")
    >>> with TFRecordWriter(path, "GZIP") as w:
    ...     w.write(serialize_example({"label": 1}))
    >>> os.path.getsize(path) > 0
    True
    """

    def __init__(self, path: str, options: Optional[str] = None) -> None:
        self._native = _native.TfRecordWriter(str(path), options)

    def write(self, record: bytes) -> None:
        self._native.write(bytes(record))

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
