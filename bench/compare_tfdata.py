#!/usr/bin/env python3
"""Runs Sluice's benchmark workloads on tf.data service and prints both side by side.

Installs nothing. Needs a Python environment with `tensorflow-cpu` (tf.data service) and a built
`sluice` binary:

    pip install tensorflow-cpu          # in a virtualenv of your choice
    cargo build --release
    python3 bench/compare_tfdata.py --sluice target/release/sluice

The tf.data service dispatcher and workers run as separate Python processes, and the client runs
in this one, as `sluice bench` runs Sluice's dispatchers and workers as child processes. Each figure
is the median of --repeats runs. Ratios are Sluice / tf.data for throughputs and tf.data / Sluice for
latencies, so a ratio above 1 always means Sluice is ahead.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

KEYS = [
    # key, unit, higher is better
    ("tiny_service_eps_1w", "elements/s", True),
    ("tiny_service_eps_2w", "elements/s", True),
    ("batched_service_eps_1w", "elements/s", True),
    ("large_mib_s", "MiB/s", True),
    ("dynamic_eps_quorum", "elements/s", True),
    ("first_element_ms", "ms", False),
    ("end_of_epoch_ms", "ms", False),
]


def run_sluice(binary, elements, large_mib):
    out = subprocess.run(
        [binary, "bench", "--json", "--elements", str(elements), "--large-mib", str(large_mib)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def serve_dispatcher(queue):
    import tensorflow as tf
    server = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0))
    queue.put(server.target)
    server.join()


def serve_worker(dispatcher_address):
    import tensorflow as tf
    server = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher_address))
    server.join()


class TfCluster:
    """A tf.data service dispatcher and workers, each in its own process."""

    def __init__(self, workers):
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        self.procs = [ctx.Process(target=serve_dispatcher, args=(queue,), daemon=True)]
        self.procs[0].start()
        self.target = queue.get(timeout=120)
        address = self.target.split("://", 1)[1]
        for _ in range(workers):
            proc = ctx.Process(target=serve_worker, args=(address,), daemon=True)
            proc.start()
            self.procs.append(proc)

    def close(self):
        for proc in self.procs:
            proc.terminate()


def read(tf, dataset, target, mode, rows=False, compression=None):
    """Returns (elements or rows, bytes, seconds, first element s, end of epoch s)."""
    started = time.perf_counter()
    ds = dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=mode, service=target, compression=compression))
    count = nbytes = 0
    first = None
    last = started
    for element in ds:
        now = time.perf_counter()
        if first is None:
            first = now - started
        last = now
        count += int(element.shape[0]) if rows and element.shape.rank else 1
        nbytes += element.numpy().nbytes
    end = time.perf_counter()
    return count, nbytes, end - started, first or 0.0, end - last


def run_tfdata(elements, large_mib):
    import tensorflow as tf
    results = {}
    one = TfCluster(1)
    try:
        read(tf, tf.data.Dataset.range(1000), one.target, "parallel_epochs")  # warm up
        n, _, s, _, _ = read(tf, tf.data.Dataset.range(elements), one.target, "parallel_epochs")
        results["tiny_service_eps_1w"] = n / s
        n, _, s, _, _ = read(tf, tf.data.Dataset.range(elements * 20).batch(1024), one.target,
                             "parallel_epochs", rows=True)
        results["batched_service_eps_1w"] = n / s
        big = tf.data.Dataset.from_tensors(tf.zeros([262144], tf.float32)).repeat(large_mib)
        _, b, s, _, _ = read(tf, big, one.target, "parallel_epochs")
        results["large_mib_s"] = b / (1 << 20) / s
        firsts, ends = [], []
        for i in range(5):
            _, _, _, first, end = read(tf, tf.data.Dataset.range(100 + i), one.target, "distributed_epoch")
            firsts.append(first * 1000)
            ends.append(end * 1000)
        results["first_element_ms"] = statistics.median(firsts)
        results["end_of_epoch_ms"] = statistics.median(ends)
    finally:
        one.close()
    two = TfCluster(2)
    try:
        read(tf, tf.data.Dataset.range(1000), two.target, "parallel_epochs")
        n, _, s, _, _ = read(tf, tf.data.Dataset.range(elements), two.target, "parallel_epochs")
        results["tiny_service_eps_2w"] = n / s
        # tf.data has one dispatcher, not a quorum: its distributed_epoch is the closest workload.
        n, _, s, _, _ = read(tf, tf.data.Dataset.range(elements // 20), two.target, "distributed_epoch")
        results["dynamic_eps_quorum"] = n / s
    finally:
        two.close()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="target/release/sluice", help="the sluice binary")
    parser.add_argument("--elements", type=int, default=200_000)
    parser.add_argument("--large-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        sys.exit("tensorflow is not installed in this Python environment (pip install tensorflow-cpu); "
                 "this script installs nothing by itself")
    if not os.path.exists(args.sluice):
        sys.exit(f"{args.sluice} does not exist: build it with cargo build --release")

    sluice_runs = [run_sluice(args.sluice, args.elements, args.large_mib) for _ in range(args.repeats)]
    tf_runs = [run_tfdata(args.elements, args.large_mib) for _ in range(args.repeats)]
    print(f"{'workload':<24} {'sluice':>14} {'tf.data':>14} {'ratio':>8}  unit (median of {args.repeats})")
    for key, unit, higher_better in KEYS:
        ours = statistics.median(r[key] for r in sluice_runs)
        theirs = statistics.median(r[key] for r in tf_runs)
        ratio = (ours / theirs) if higher_better else (theirs / ours)
        print(f"{key:<24} {ours:>14.1f} {theirs:>14.1f} {ratio:>7.1f}x  {unit}")


if __name__ == "__main__":
    main()
