"""``python -m sluice.map_bench``: a CPU-bound Python ``map`` on a Sluice worker, beside the
same function in a plain loop and in ``multiprocessing.Pool``.

The function (:func:`augment`) is numpy augmentation of a 64x64x3 ``uint8`` image made from the
element's index: a random crop of a padded copy, a flip, brightness and contrast jitter, and a
3x3 box blur, repeated ``--rounds`` times so a call costs a few milliseconds. Every setup calls
it on the same indices ``0..n`` and consumes the same images:

- ``loop``: ``[augment(i) for i in range(n)]`` in this process;
- ``pool``: ``multiprocessing.Pool(P).imap(augment, range(n), chunksize=C)``;
- ``sluice``: ``Dataset.range(n).map(augment)`` distributed (``parallel_epochs``) to one worker
  with ``P`` Python executors; the dispatcher and the worker run in their own processes, the
  reader in this one.

Each figure is images per second, the median of ``--epochs`` runs, run in turn in one process
so the ratios compare like with like on a shared machine. One line per figure, then a JSON
object of every figure on the last line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Callable, Dict, Iterable, Optional, Sequence

import numpy as np

SIDE = 64
PAD = 4
#: How many times `augment` repeats its steps (its cost per call).
ROUNDS = 20


def augment(index: int, rounds: int = ROUNDS) -> np.ndarray:
    """A 64x64x3 uint8 image made from ``index``, augmented ``rounds`` times."""
    rng = np.random.default_rng(int(index))
    image = rng.integers(0, 256, size=(SIDE, SIDE, 3), dtype=np.uint8)
    for _ in range(rounds):
        padded = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)), mode="reflect")
        top, left = rng.integers(0, 2 * PAD + 1, size=2)
        crop = padded[top : top + SIDE, left : left + SIDE].astype(np.float32)
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = (crop - crop.mean()) * rng.uniform(0.8, 1.2) + crop.mean() + rng.uniform(-20, 20)
        blurred = np.zeros_like(crop)
        edged = np.pad(crop, ((1, 1), (1, 1), (0, 0)), mode="edge")
        for dy in range(3):
            for dx in range(3):
                blurred += edged[dy : dy + SIDE, dx : dx + SIDE]
        image = np.clip(blurred / 9.0, 0, 255).astype(np.uint8)
    return image


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    figures: Dict[str, float] = {
        "load_1min": round(os.getloadavg()[0], 2),
        "processes": args.processes,
        "images": args.images,
    }
    rates = {
        "loop": _median(args.epochs, lambda: _loop(args.images)),
        "pool": _median(args.epochs, lambda: _pool(args.images, args.processes, args.chunksize)),
        "sluice": _sluice(args.images, args.processes, args.epochs),
    }
    for name, rate in rates.items():
        figures[f"py_map_{name}_ips"] = round(rate, 1)
        print(f"py_map_{name}_ips {rate:>12,.1f} images/s", flush=True)
    figures["sluice_vs_pool"] = round(rates["sluice"] / rates["pool"], 3)
    figures["sluice_vs_loop"] = round(rates["sluice"] / rates["loop"], 3)
    print(
        f"sluice/pool {figures['sluice_vs_pool']:.3f}   sluice/loop {figures['sluice_vs_loop']:.3f}",
        flush=True,
    )
    print(json.dumps(figures), flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.map_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--images", type=int, default=3000, help="images per run")
    parser.add_argument("--epochs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--processes", type=int, default=2, help="Pool processes and the worker's executors"
    )
    parser.add_argument("--chunksize", type=int, default=8, help="Pool.imap's chunksize")
    return parser


#: The sum of every pixel of `augment(0..n)`, by `n`: each setup must produce the same images.
_CHECKSUMS: Dict[int, int] = {}


def _timed(images: "Callable[[], Iterable[np.ndarray]]", n: int) -> float:
    """Images per second of consuming ``images()``, checking they are ``augment(0..n)``."""
    start = time.perf_counter()
    count, checksum = 0, 0
    for image in images():
        count += 1
        checksum += int(image.sum(dtype=np.int64))
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"expected {n} images, got {count}")
    if _CHECKSUMS.setdefault(n, checksum) != checksum:
        raise RuntimeError(f"the images differ from the first setup's (pixel sum {checksum})")
    return n / elapsed


def _loop(n: int) -> float:
    return _timed(lambda: (augment(i) for i in range(n)), n)


def _pool(n: int, processes: int, chunksize: int) -> float:
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        # Started and warm before the clock runs, as the Sluice worker's executors are.
        pool.map(abs, range(processes))
        return _timed(lambda: pool.imap(augment, range(n), chunksize=chunksize), n)


def _sluice(n: int, executors: int, epochs: int) -> float:
    import sluice
    from sluice.bench import _Child
    from sluice.data import Dataset

    dispatcher = _Child([sys.executable, "-m", "sluice.bench", "serve", "dispatcher"])
    children = [dispatcher]
    try:
        worker = _Child(
            [sys.executable, "-m", "sluice.bench", "serve", "worker"]
            + ["--dispatcher", dispatcher.address, "--python-executors", str(executors)]
        )
        children.append(worker)

        def epoch() -> float:
            distributed = (
                Dataset.range(n)
                .map(augment)
                .apply(sluice.distribute("parallel_epochs", dispatcher.address, compression=None))
            )
            return _timed(lambda: iter(distributed), n)

        epoch()  # the executors load the function once; not timed, as the Pool's warm-up
        return _median(epochs, epoch)
    finally:
        for child in reversed(children):
            child.stop()


def _median(epochs: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(max(epochs, 1)))


if __name__ == "__main__":
    sys.exit(main())
