"""``python -m sluice.map_bench``: Python ``map`` functions on a Sluice worker, beside the
same functions in a plain loop and in ``multiprocessing.Pool``.

Three functions, from cheap to slow (``--workloads``, all by default):

- ``tiny`` (:func:`tiny`, about 20 µs): a few numpy ops on a 16-float vector, whose result is
  a scalar; the inputs are ``from_tensor_slices`` of ``--images`` such vectors, repeated 4
  times;
- ``image`` (:func:`normalize`, about 0.25 ms): ``uint8`` 64x64x3 images to standardized
  ``float32`` ones with a padded crop, a flip, and contrast, brightness and saturation changes,
  ``from_tensor_slices(images).repeat(4)``;
- ``augment`` (:func:`augment`, a few milliseconds): a random crop of a padded copy, a flip,
  jitter and a 3x3 box blur of an image made from the element's index, ``ROUNDS`` times.

Every setup calls the function on the same inputs in the same order and consumes the same
outputs (checked by a checksum):

- ``loop``: ``[fn(x) for x in inputs]`` in this process;
- ``pool``: ``multiprocessing.Pool(P).imap(fn, inputs, chunksize=C)``;
- ``sluice``: the dataset ``.map(fn)`` distributed (``parallel_epochs``) to one worker with
  ``P`` Python executors, without compression (``--compression auto`` for ``distribute``'s
  default); the dispatcher and the worker run in their own processes, the reader in this one.

With ``--cpu`` (Linux), each Sluice epoch also measures the CPU time each process spent on it
(the reader, that is this process; the worker; its executors together; the dispatcher), from
``/proc``, and prints its median per element.

Each figure is elements per second, the median of ``--epochs`` runs. The setups of a workload
take turns epoch by epoch (a loop epoch, a Pool epoch, a Sluice epoch, then again), with the
Pool and the Sluice servers started once before the first, so a shared machine's slow spell
falls on every setup alike and the ratios compare like with like. One line per figure and a
line of ratios per workload, then a JSON object of every figure on the last line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

SIDE = 64
PAD = 4
#: How many times `augment` repeats its steps (its cost per call).
ROUNDS = 20
#: The floats of one `tiny` input.
TINY_WIDTH = 16
#: How many times the `tiny` and `image` inputs are repeated (``.repeat(4)``).
REPEATS = 4
#: A pixel's luminance from its channels (ITU-R BT.601), for `normalize`'s saturation change.
_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float32)
#: ImageNet's channel means and the inverse of its deviations, for `normalize`.
_CHANNEL_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_CHANNEL_SCALE = (1 / np.array([0.229, 0.224, 0.225], dtype=np.float32)).astype(np.float32)


def tiny(x: np.ndarray) -> np.float32:
    """About 20 µs of numpy on a small vector: a scalar out."""
    y = np.tanh(x * np.float32(0.5))
    return np.float32((y * y).sum(dtype=np.float32) + x.mean(dtype=np.float32))


def normalize(image: np.ndarray) -> np.ndarray:
    """About 0.25 ms: a ``uint8`` image to a standardized ``float32`` one (48 KiB out for 12 KiB
    in), the usual training augmentation.

    A crop of a reflect-padded copy, a horizontal flip, a contrast and brightness change, a
    saturation change, clipping to [0, 1] and standardizing each channel with ImageNet's mean
    and deviation. The crop's offset and the flip come from the image's first pixel, so every
    setup computes the same outputs.
    """
    seed = image[0, 0]
    top, left = int(seed[0]) % (2 * PAD + 1), int(seed[1]) % (2 * PAD + 1)
    padded = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)), mode="reflect")
    x = padded[top : top + SIDE, left : left + SIDE].astype(np.float32) * np.float32(1 / 255)
    if seed[2] & 1:
        x = x[:, ::-1]
    mean = x.mean(axis=(0, 1), dtype=np.float32)
    x = (x - mean) * np.float32(1.2) + mean + np.float32(0.05)
    gray = (x @ _GRAY)[..., None]
    x = gray + (x - gray) * np.float32(0.8)
    x = np.clip(x, np.float32(0.0), np.float32(1.0))
    return (x - _CHANNEL_MEAN) * _CHANNEL_SCALE


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
    figures: Dict[str, Any] = {
        "load_1min": round(os.getloadavg()[0], 2),
        "processes": args.processes,
        "chunksize": args.chunksize,
        "compression": args.compression,
        "elements": args.images,
    }
    for workload in args.workloads.split(","):
        if workload not in _WORKLOADS:
            raise SystemExit(f"unknown workload {workload!r}: one of {', '.join(_WORKLOADS)}")
        fn, inputs, dataset = _WORKLOADS[workload](args.images)
        rates, cpu = _interleaved(fn, inputs, dataset, workload, args)
        for setup, rate in rates.items():
            figures[f"py_map_{workload}_{setup}_eps"] = round(rate, 1)
            print(f"py_map_{workload}_{setup}_eps {rate:>12,.1f} elements/s", flush=True)
        if cpu:
            for process, micros in cpu.items():
                figures[f"{workload}_sluice_cpu_us_{process}"] = round(micros, 1)
            shares = "   ".join(f"{process} {micros:.1f}" for process, micros in cpu.items())
            print(f"{workload}: CPU µs per element: {shares}", flush=True)
        for other in ("pool", "loop"):
            figures[f"{workload}_sluice_vs_{other}"] = round(rates["sluice"] / rates[other], 3)
        print(
            f"{workload}: sluice/pool {figures[f'{workload}_sluice_vs_pool']:.3f}   "
            f"sluice/loop {figures[f'{workload}_sluice_vs_loop']:.3f}",
            flush=True,
        )
    figures["load_1min_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures), flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.map_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--workloads",
        default=",".join(_WORKLOADS),
        help="comma-separated: tiny, image, augment (default: all)",
    )
    parser.add_argument(
        "--images",
        type=int,
        default=3000,
        help="elements per run (tiny and image: this many inputs, in distinct inputs repeated "
        f"{REPEATS} times)",
    )
    parser.add_argument("--epochs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--processes", type=int, default=2, help="Pool processes and the worker's executors"
    )
    parser.add_argument("--chunksize", type=int, default=32, help="Pool.imap's chunksize")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also print each Sluice process's CPU time per element (Linux)",
    )
    parser.add_argument(
        "--compression",
        choices=("none", "auto"),
        default="none",
        help="distribute's compression (default: none; auto is distribute's own default)",
    )
    return parser


def _augment_workload(n: int) -> Any:
    from sluice.data import Dataset

    return augment, list(range(n)), Dataset.range(n)


def _tiny_workload(n: int) -> Any:
    from sluice.data import Dataset

    distinct = np.random.default_rng(7).standard_normal(
        (max(n // REPEATS, 1), TINY_WIDTH), dtype=np.float32
    )
    inputs = [distinct[i % len(distinct)] for i in range(len(distinct) * REPEATS)]
    return tiny, inputs, Dataset.from_tensor_slices(distinct).repeat(REPEATS)


def _image_workload(n: int) -> Any:
    from sluice.data import Dataset

    distinct = np.random.default_rng(11).integers(
        0, 256, size=(max(n // REPEATS, 1), SIDE, SIDE, 3), dtype=np.uint8
    )
    inputs = [distinct[i % len(distinct)] for i in range(len(distinct) * REPEATS)]
    return normalize, inputs, Dataset.from_tensor_slices(distinct).repeat(REPEATS)


#: A workload's function, its inputs for the loop and the Pool, and the same as a dataset.
_WORKLOADS: Dict[str, Callable[[int], Any]] = {
    "tiny": _tiny_workload,
    "image": _image_workload,
    "augment": _augment_workload,
}

#: The checksum of each workload's outputs: each setup must produce the same.
_CHECKSUMS: Dict[str, float] = {}


def _timed(outputs: "Callable[[], Iterable[Any]]", n: int, workload: str) -> float:
    """Elements per second of consuming ``outputs()``, checking their count and checksum."""
    start = time.perf_counter()
    count, checksum = 0, 0.0
    for output in outputs():
        count += 1
        checksum += float(np.asarray(output).sum(dtype=np.float64))
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"{workload}: expected {n} outputs, got {count}")
    if _CHECKSUMS.setdefault(workload, checksum) != checksum:
        raise RuntimeError(f"{workload}: the outputs differ from the first setup's ({checksum})")
    return n / elapsed


def _interleaved(
    fn: Callable[[Any], Any], inputs: List[Any], dataset: Any, workload: str, args: Any
) -> "tuple[Dict[str, float], Dict[str, float]]":
    """The median rate of each setup over ``args.epochs`` turns, the setups taking turns; with
    ``args.cpu``, also each Sluice process's median CPU µs per element."""
    epochs: Dict[str, List[float]] = {"loop": [], "pool": [], "sluice": []}
    cpu: Dict[str, List[float]] = {}
    compression = None if args.compression == "none" else "AUTO"
    with _Pool(args.processes) as pool, _Sluice(args.processes, compression) as service:
        # Warm before the clock runs: the Pool's processes started, the executors' function
        # loaded.
        service.epoch(dataset, fn, len(inputs), workload)
        for _ in range(max(args.epochs, 1)):
            epochs["loop"].append(_loop(fn, inputs, workload))
            epochs["pool"].append(pool.epoch(fn, inputs, args.chunksize, workload))
            before = service.cpu_seconds() if args.cpu else {}
            epochs["sluice"].append(service.epoch(dataset, fn, len(inputs), workload))
            for process, seconds in (service.cpu_seconds() if args.cpu else {}).items():
                spent = seconds - before.get(process, 0.0)
                cpu.setdefault(process, []).append(spent / len(inputs) * 1e6)
    rates = {setup: statistics.median(rates) for setup, rates in epochs.items()}
    return rates, {process: statistics.median(spent) for process, spent in cpu.items()}


def _loop(fn: Callable[[Any], Any], inputs: List[Any], workload: str) -> float:
    return _timed(lambda: (fn(x) for x in inputs), len(inputs), workload)


class _Pool:
    """``multiprocessing.Pool(processes)``, started and warm."""

    def __init__(self, processes: int) -> None:
        self.pool = multiprocessing.get_context("spawn").Pool(processes)
        self.pool.map(abs, range(processes))

    def __enter__(self) -> "_Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pool.terminate()
        self.pool.join()

    def epoch(
        self, fn: Callable[[Any], Any], inputs: List[Any], chunksize: int, workload: str
    ) -> float:
        return _timed(
            lambda: self.pool.imap(fn, inputs, chunksize=chunksize), len(inputs), workload
        )


class _Sluice:
    """A dispatcher and a worker with ``executors`` Python executors, each in its own
    process; epochs are read in this one."""

    def __init__(self, executors: int, compression: Optional[str]) -> None:
        from sluice.bench import _Child

        self.compression = compression
        self.children = [_Child([sys.executable, "-m", "sluice.bench", "serve", "dispatcher"])]
        self.address = self.children[0].address
        try:
            self.children.append(
                _Child(
                    [sys.executable, "-m", "sluice.bench", "serve", "worker"]
                    + ["--dispatcher", self.address, "--python-executors", str(executors)]
                )
            )
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self) -> "_Sluice":
        return self

    def __exit__(self, *exc: Any) -> None:
        for child in reversed(self.children):
            child.stop()

    def epoch(self, dataset: Any, fn: Callable[[Any], Any], n: int, workload: str) -> float:
        import sluice

        distributed = dataset.map(fn).apply(
            sluice.distribute("parallel_epochs", self.address, compression=self.compression)
        )
        return _timed(lambda: iter(distributed), n, workload)

    def cpu_seconds(self) -> Dict[str, float]:
        """The CPU seconds (user and system) each process has spent so far: this one (the
        reader), the worker, its executors (together) and the dispatcher."""
        import resource

        me = resource.getrusage(resource.RUSAGE_SELF)
        dispatcher, worker = (child.process.pid for child in self.children)
        return {
            "reader": me.ru_utime + me.ru_stime,
            "worker": _proc_cpu_seconds(worker),
            "executors": sum(_proc_cpu_seconds(pid) for pid in _proc_children(worker)),
            "dispatcher": _proc_cpu_seconds(dispatcher),
        }


def _proc_cpu_seconds(pid: int) -> float:
    """A process's CPU seconds from ``/proc/PID/stat`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime, the 14th and 15th fields (the 12th and 13th after the name).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_children(pid: int) -> List[int]:
    """A process's children, from ``/proc/PID/task/*/children``."""
    found: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


if __name__ == "__main__":
    sys.exit(main())
