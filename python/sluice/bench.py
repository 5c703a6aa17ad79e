"""``python -m sluice.bench``: how fast elements reach Python, beside tf.data service.

Three figures, each the median of a few epochs, each epoch a new job timed from the first
``next`` to the end of input (so job start-up is included; the epochs are long enough that it
is a small part):

- ``py_tiny_eps``: unbatched int64 scalars (``range(n)``) per second;
- ``py_batched_eps``: ``range(n).batch(1024)``, counted in elements (rows) per second;
- ``py_large_mib_s``: MiB/s of 1 MiB float32 tensors arriving as numpy arrays.

Every workload runs under ``parallel_epochs`` with one worker, uncompressed, with each client's
default window of outstanding requests (autotuned). The dispatcher and
the worker run in their own processes (``python -m sluice.bench serve ...``), and the client
reads in this one, as ``sluice bench`` measures. When tensorflow is importable (here, or in the
interpreter ``--tf-python`` names) the same workloads run on tf.data service's own servers and
Python client, each in its own process, and the ratios sluice/tf.data are printed beside them.

With ``--vs-window N`` each workload also runs with a fixed window of ``N`` outstanding
requests (``max_outstanding_requests=N``), its epochs alternating with the autotuned ones in
the same sitting, and the ratio autotuned/fixed is printed: what the autotuned window, which
starts small so a shared job's other readers and late workers get their share, costs in
throughput against a deep fixed one.

One line per figure, then a JSON object of every figure on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from sluice._bench_timing import LARGE_FLOATS, timed

#: 1 MiB of float32 values.
BATCH = 1024
#: The figure each workload reports, and its unit.
FIGURES = {
    "tiny": ("py_tiny_eps", "elements/s"),
    "batched": ("py_batched_eps", "elements/s"),
    "large": ("py_large_mib_s", "MiB/s"),
}
STARTUP_SECONDS = 60.0
TF_SCRIPT = Path(__file__).with_name("_tf_bench.py")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args.role, args.dispatcher, args.python_executors, args.data_root)
    return _bench(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per figure (median)")
    parser.add_argument("--tiny", type=int, default=2_000_000, help="elements of `tiny`")
    parser.add_argument("--batched", type=int, default=50_000_000, help="rows of `batched`")
    parser.add_argument("--large-mib", type=int, default=2048, help="1 MiB tensors of `large`")
    parser.add_argument("--tf-tiny", type=int, default=30_000, help="tf.data's `tiny` size")
    parser.add_argument("--tf-batched", type=int, default=5_000_000, help="tf.data's `batched`")
    parser.add_argument("--tf-large-mib", type=int, default=1024, help="tf.data's `large`")
    parser.add_argument(
        "--only", choices=sorted(FIGURES), action="append", help="run these workloads only"
    )
    parser.add_argument(
        "--tf-python",
        help="a Python interpreter with tensorflow for tf.data's side "
        "(default: this one, if it imports tensorflow)",
    )
    parser.add_argument("--no-tf", action="store_true", help="measure sluice only")
    parser.add_argument(
        "--vs-window",
        type=int,
        help="also run each workload with this fixed window, alternating, and print the ratio",
    )
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="serve a dispatcher or worker until stdin closes")
    serve.add_argument("role", choices=["dispatcher", "worker"])
    serve.add_argument("--dispatcher", help="the worker's dispatcher")
    serve.add_argument(
        "--python-executors",
        type=int,
        default=0,
        help="the worker's Python executors (default 0: none, Python functions refused)",
    )
    serve.add_argument(
        "--data-root", action="append", help="a directory files may be read from (repeatable)"
    )
    return parser


def _serve(
    role: str,
    dispatcher: Optional[str],
    python_executors: int = 0,
    data_roots: Optional[List[str]] = None,
) -> int:
    """Serves one server until stdin closes, after printing ``READY <address>``."""
    import sluice

    if role == "dispatcher":
        server = sluice.DispatchServer(sluice.DispatcherConfig(data_roots=data_roots))
        address = server.target
    else:
        if dispatcher is None:
            raise SystemExit("serve worker needs --dispatcher")
        config = sluice.WorkerConfig(
            dispatcher, python_executors=python_executors, data_roots=data_roots
        )
        server = sluice.WorkerServer(config)
        address = server.address
    print(f"READY {address}", flush=True)
    sys.stdin.read()
    server.stop()
    return 0


class _Child:
    """A server process that prints ``READY <address>`` and serves until its stdin closes."""

    def __init__(self, argv: List[str], quiet: bool = False) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
        )
        lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                line = ""
            if line.startswith("READY "):
                self.address = line.split(maxsplit=1)[1].strip()
                return
            if not line:
                self.stop()
                raise RuntimeError(f"{argv} did not start")

    def _read(self, lines: "queue.Queue[str]") -> None:
        """Hands the child's output lines to `lines`, then "" at its end (read apart from the
        start-up wait, so that a silent child cannot outlast the deadline)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.put(line)
        lines.put("")

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _bench(args: argparse.Namespace) -> int:
    workloads = args.only or list(FIGURES)
    sizes = {"tiny": args.tiny, "batched": args.batched, "large": args.large_mib}
    tf_sizes = {"tiny": args.tf_tiny, "batched": args.tf_batched, "large": args.tf_large_mib}
    figures: Dict[str, float] = {"load_1min": round(os.getloadavg()[0], 2)}
    ours, fixed = _sluice_figures(workloads, sizes, args.epochs, args.vs_window)
    tf_python = None if args.no_tf else _tf_interpreter(args.tf_python)
    theirs: Dict[str, float] = {}
    if tf_python is not None:
        theirs = _tf_figures(tf_python, workloads, tf_sizes, args.epochs)
    else:
        print("tf.data: not measured (no interpreter with tensorflow)", flush=True)
    for workload in workloads:
        name, unit = FIGURES[workload]
        figures[name] = round(ours[workload], 1)
        line = f"{name:<16} {ours[workload]:>16,.0f} {unit}"
        if workload in theirs:
            tf_name = "tf_" + name[len("py_") :]
            ratio = ours[workload] / theirs[workload]
            figures[tf_name] = round(theirs[workload], 1)
            figures["ratio_" + name[len("py_") :]] = round(ratio, 2)
            line += f"   tf.data {theirs[workload]:,.0f} {unit}   sluice/tf.data {ratio:,.2f}x"
        print(line, flush=True)
        if workload in fixed:
            short = name[len("py_") :]
            ratio = ours[workload] / fixed[workload]
            figures[f"{name}_window{args.vs_window}"] = round(fixed[workload], 1)
            figures[f"ratio_{short}_autotuned_vs_window"] = round(ratio, 3)
            print(
                f"{'':<16} window {args.vs_window}: {fixed[workload]:,.0f} {unit}   "
                f"autotuned/fixed {ratio:,.3f}x",
                flush=True,
            )
    print(json.dumps(figures), flush=True)
    return 0


def _sluice_figures(
    workloads: List[str], sizes: Dict[str, int], epochs: int, window: Optional[int] = None
) -> "tuple[Dict[str, float], Dict[str, float]]":
    """The autotuned figures, and with `window` the fixed-window ones, their epochs alternating."""
    dispatcher = _Child([sys.executable, "-m", "sluice.bench", "serve", "dispatcher"])
    children = [dispatcher]
    try:
        worker = _Child(
            [sys.executable, "-m", "sluice.bench", "serve", "worker"]
            + ["--dispatcher", dispatcher.address]
        )
        children.append(worker)
        autotuned: Dict[str, float] = {}
        fixed: Dict[str, float] = {}
        for w in workloads:
            rates: Dict[Optional[int], List[float]] = {None: [], window: []}
            for _ in range(max(epochs, 1)):
                for each in [None] if window is None else [None, window]:
                    rates[each].append(_sluice_epoch(dispatcher.address, w, sizes[w], each))
            autotuned[w] = statistics.median(rates[None])
            if window is not None:
                fixed[w] = statistics.median(rates[window])
        return autotuned, fixed
    finally:
        for child in reversed(children):
            child.stop()


def _sluice_epoch(target: str, workload: str, size: int, window: Optional[int] = None) -> float:
    """Reads one epoch of a new job; returns its rate (elements or MiB per second)."""
    import numpy as np

    import sluice
    from sluice.data import Dataset

    if workload == "large":
        tensor = np.full((1, LARGE_FLOATS), 0.5, np.float32)
        dataset = Dataset.from_tensor_slices(tensor).repeat(size)
    elif workload == "batched":
        dataset = Dataset.range(size).batch(BATCH)
    else:
        dataset = Dataset.range(size)
    distributed = dataset.apply(
        sluice.distribute(
            "parallel_epochs",
            target,
            compression=None,
            max_outstanding_requests=window,
        )
    )
    return timed(iter(distributed), workload, size)


def _tf_interpreter(given: Optional[str]) -> Optional[str]:
    candidate = given or sys.executable
    probe = subprocess.run(
        [candidate, "-c", "import tensorflow"], capture_output=True, check=False
    )
    if probe.returncode == 0:
        return candidate
    if given is not None:
        raise SystemExit(f"{given} cannot import tensorflow: {probe.stderr.decode()[-500:]}")
    return None


def _tf_figures(
    python: str, workloads: List[str], sizes: Dict[str, int], epochs: int
) -> Dict[str, float]:
    """tf.data service's servers and client, each in its own process of `python`."""
    script = str(TF_SCRIPT)
    # tensorflow's servers log every start-up step to stderr.
    dispatcher = _Child([python, script, "dispatcher"], quiet=True)
    children = [dispatcher]
    try:
        worker = [python, script, "worker", "--dispatcher", dispatcher.address]
        children.append(_Child(worker, quiet=True))
        figures = {}
        for workload in workloads:
            client = subprocess.run(
                [python, script, "client", "--dispatcher", dispatcher.address]
                + ["--workload", workload, "--size", str(sizes[workload])]
                + ["--epochs", str(epochs)],
                capture_output=True,
                text=True,
                check=False,
            )
            if client.returncode != 0:
                raise RuntimeError(f"tf.data's client failed: {client.stderr[-2000:]}")
            figures[workload] = float(json.loads(client.stdout.strip().splitlines()[-1])["rate"])
        return figures
    finally:
        for child in reversed(children):
            child.stop()


if __name__ == "__main__":
    sys.exit(main())
