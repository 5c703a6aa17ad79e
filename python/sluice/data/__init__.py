"""``sluice.data``: tf.data's ``Dataset`` over Sluice's pipelines.

A :class:`Dataset` is a source and a list of ops, built as in tf.data. Iterating it runs the
pipeline in this process; applying :func:`sluice.distribute` sends it to the service's workers,
and ops chained after that run in this process on the elements read. Elements arrive as numpy
values: numpy scalars, arrays, ``bytes`` for strings, tuples and dicts kept::

    >>> from sluice.data import Dataset
    >>> list(Dataset.range(5).map("square").batch(2).as_numpy_iterator())
    [array([0, 1]), array([4, 9]), array([16])]

``map``, ``filter``, ``flat_map``, ``interleave``, ``take_while``, ``group_by_window`` and
``Dataset.from_generator`` take any Python callable; before ``distribute`` it runs on the
workers, after it in this process (``interleave`` and ``group_by_window`` run natively what
they can trace). ``map`` and ``filter`` also take the names of
built-in functions, which run natively (``identity``, ``square``, ``negate``, ``add_one``,
``to_float``; ``is_even``, ``is_odd``).
"""

from __future__ import annotations

from sluice.data import experimental
from sluice.data.dataset import AUTOTUNE, Dataset, TextLineDataset, TFRecordDataset
from sluice.data.options import Options
from sluice.data.tensor_spec import TensorSpec

__all__ = [
    "AUTOTUNE",
    "Dataset",
    "Options",
    "TFRecordDataset",
    "TextLineDataset",
    "TensorSpec",
    "experimental",
]
