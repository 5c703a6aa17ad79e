"""Padded batching in numpy, and the functions ``bucket_by_sequence_length`` runs as a
``group_by_window``: an element's bucket, a bucket's batch size, and a window to one batch.

``pad_batch`` is the padding rule of tf.data's ``padded_batch``: every component padded at
the end of each dimension to a common shape (a given dimension, or the batch's longest) with a
padding value (0, ``b""`` for strings, by default), then stacked.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

_INT32_MIN = int(np.iinfo(np.int32).min)
_INT32_MAX = int(np.iinfo(np.int32).max)


def pad_batch(
    elements: Sequence[Any], shapes: Any = None, values: Any = None, filler: Optional[int] = None
) -> Any:
    """``elements`` (alike structures of tuples, dicts and arrays) stacked into one, each
    component padded to ``shapes`` (its structure, or ``None``): a dimension ``None`` or -1
    there, or every dimension without ``shapes``, is ``filler`` when given, else the longest
    in the batch."""
    first = elements[0]
    if isinstance(first, tuple):
        return tuple(
            pad_batch([e[i] for e in elements], _part(shapes, i), _part(values, i), filler)
            for i in range(len(first))
        )
    if isinstance(first, dict):
        return {
            k: pad_batch([e[k] for e in elements], _part(shapes, k), _part(values, k), filler)
            for k in first
        }
    arrays = [np.asarray(e) for e in elements]
    rank = arrays[0].ndim
    if any(a.ndim != rank for a in arrays):
        raise ValueError("padded batching needs components of one rank")
    longest = [max(a.shape[d] for a in arrays) for d in range(rank)]
    wanted = list(shapes) if shapes is not None else [None] * rank
    if len(wanted) != rank:
        raise ValueError(f"padded shape {tuple(wanted)} does not have the component's rank {rank}")
    target = []
    for d, w in enumerate(wanted):
        size = longest[d] if filler is None else filler
        size = size if w is None or w == -1 else int(w)
        if size < longest[d]:
            raise ValueError(
                f"a component of shape {tuple(longest)} does not fit the padded shape "
                f"{tuple(size if i == d else s for i, s in enumerate(longest))}"
            )
        target.append(size)
    kind = arrays[0].dtype
    if values is None:
        fill: Any = b"" if kind.kind in "SOU" else 0
    else:
        fill = values
    out = np.full([len(arrays)] + target, fill, dtype=object if kind.kind in "SOU" else kind)
    for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(0, n) for n in a.shape)] = a
    return out


def _part(structure: Any, key: Any) -> Any:
    """The part of a padded-shapes or padding-values structure for one component; a scalar
    padding value applies to all."""
    if structure is None:
        return None
    if isinstance(structure, (tuple, dict)):
        return structure[key]
    return structure


def _stack(elements: Sequence[Any]) -> Any:
    first = elements[0]
    if isinstance(first, tuple):
        return tuple(_stack([e[i] for e in elements]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack([e[k] for e in elements]) for k in first}
    return np.stack([np.asarray(e) for e in elements])


class BucketOf:
    """An element's bucket: the ``i`` with ``boundaries[i-1] <= length < boundaries[i]``."""

    def __init__(self, length: Callable[..., Any], boundaries: List[int]) -> None:
        self.length = length
        self.boundaries = boundaries
        self.__qualname__ = getattr(length, "__qualname__", type(length).__name__)
        self.__module__ = getattr(length, "__module__", None) or "?"

    def __call__(self, *element: Any) -> np.int64:
        n = int(self.length(*element))
        lows = [_INT32_MIN] + self.boundaries
        highs = self.boundaries + [_INT32_MAX]
        for i, (low, high) in enumerate(zip(lows, highs)):
            if low <= n < high:
                return np.int64(i)
        raise ValueError(f"element length {n} is in no bucket")


class BucketSize:
    """A bucket's batch size, its window size."""

    def __init__(self, sizes: List[int]) -> None:
        self.sizes = sizes

    def __call__(self, bucket: Any) -> np.int64:
        return np.int64(self.sizes[int(bucket)])


class BucketBatch:
    """A bucket's window to its batch (none when ``drop_remainder`` drops it)."""

    def __init__(
        self,
        sizes: List[int],
        boundaries: List[int],
        padded_shapes: Any,
        padding_values: Any,
        pad_to_bucket_boundary: bool,
        no_padding: bool,
        drop_remainder: bool,
    ) -> None:
        self.sizes = sizes
        self.boundaries = boundaries
        self.padded_shapes = padded_shapes
        self.padding_values = padding_values
        self.pad_to_bucket_boundary = pad_to_bucket_boundary
        self.no_padding = no_padding
        self.drop_remainder = drop_remainder

    def __call__(self, bucket: Any, window: Sequence[Any]) -> List[Any]:
        bucket = int(bucket)
        if not window or (self.drop_remainder and len(window) < self.sizes[bucket]):
            return []
        if self.no_padding:
            return [_stack(window)]
        filler = None
        if self.pad_to_bucket_boundary:
            if bucket >= len(self.boundaries):
                raise ValueError(
                    "When pad_to_bucket_boundary=True, elements must have length < "
                    "max(bucket_boundaries)."
                )
            filler = self.boundaries[bucket] - 1
        return [pad_batch(window, self.padded_shapes, self.padding_values, filler)]
