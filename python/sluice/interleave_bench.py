"""``python -m sluice.interleave_bench``: many slow files read by ``interleave`` one after
another, and concurrently with ``num_parallel_calls``.

It writes ``--files`` text files of ``--lines`` lines each in a temporary directory, and reads
them as ``Dataset.list_files(...).interleave(lambda f: TextLineDataset(f).map(slow),
cycle_length=C)``, where ``slow`` waits ``--delay-ms`` per line: a stand-in for a file system
whose reads take that long (a network file system, object storage). ``interleave`` turns the
lambda into a native template, so only ``slow`` runs in Python, and its wait releases the
interpreter as a read would. Each setup reads every line once, in this process:

- ``sequential``: ``num_parallel_calls`` unset, the inner datasets read in the reader's thread;
- ``parallel``: ``num_parallel_calls=AUTOTUNE``, each open inner dataset read by its own thread.

Each figure is lines per second, the median of ``--epochs`` runs; the last line is a JSON object
of every figure and the speed-up. Both setups yield the same lines in the same order (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sluice.data import AUTOTUNE, Dataset, TextLineDataset


def write_files(directory: Path, files: int, lines: int) -> None:
    for f in range(files):
        (directory / f"part-{f:04d}.txt").write_text(
            "".join(f"{f}:{i}\n" for i in range(lines))
        )


def read(directory: Path, cycle_length: int, delay: float, parallel: bool) -> List[bytes]:
    def slow(line: Any) -> Any:
        time.sleep(delay)
        return line

    names = Dataset.list_files(str(directory / "*.txt"), shuffle=False)
    ds = names.interleave(
        lambda f: TextLineDataset(f).map(slow),
        cycle_length=cycle_length,
        num_parallel_calls=AUTOTUNE if parallel else None,
    )
    return list(ds)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--lines", type=int, default=25)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--cycle-length", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    figures: Dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_files(directory, args.files, args.lines)
        orders = {}
        for name, parallel in (("sequential", False), ("parallel", True)):
            rates = []
            for _ in range(args.epochs):
                start = time.perf_counter()
                got = read(directory, args.cycle_length, args.delay_ms / 1000, parallel)
                rates.append(len(got) / (time.perf_counter() - start))
            orders[name] = got
            figures[name] = statistics.median(rates)
            print(f"{name}: {figures[name]:.0f} lines/s", flush=True)
        if orders["sequential"] != orders["parallel"]:
            raise SystemExit("the parallel interleave yielded another order")
    figures["speedup"] = figures["parallel"] / figures["sequential"]
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
