"""The timed read both sides of ``python -m sluice.bench`` share: sluice's client in the
benchmark's process, and tf.data's in ``_tf_bench.py`` under an interpreter that may not have
sluice. Standard library only, so that script can load it by path.
"""

from __future__ import annotations

import time
from typing import Iterable

LARGE_FLOATS = 262_144
"""Floats of one large (1 MiB) float32 tensor."""


def timed(elements: Iterable, workload: str, size: int) -> float:  # type: ignore[type-arg]
    """Reads `elements` to the end and returns `size` per second; checks it read `size`
    elements (``tiny``), rows (``batched``) or MiB (``large``)."""
    count = 0
    started = time.perf_counter()
    if workload == "tiny":
        for _ in elements:
            count += 1
    elif workload == "batched":
        for batch in elements:
            count += len(batch)
    else:
        nbytes = 0
        for tensor in elements:
            nbytes += tensor.nbytes
        count = nbytes // (LARGE_FLOATS * 4)
    seconds = time.perf_counter() - started
    if count != size:
        raise RuntimeError(f"{workload}: read {count} of {size}")
    return size / seconds
