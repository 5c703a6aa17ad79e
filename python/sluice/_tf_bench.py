"""tf.data service's side of ``python -m sluice.bench``, run as a script by an interpreter that
has tensorflow (which need not have sluice): ``python _tf_bench.py dispatcher``, ``worker
--dispatcher ADDRESS``, or ``client --dispatcher ADDRESS --workload W --size N --epochs K``.

The servers print ``READY <address>`` and serve until stdin closes. The client reads the
workloads of ``sluice.bench`` (same datasets, ``parallel_epochs``, uncompressed, the default
window of outstanding requests) through tf.data's own Python client and prints
``{"rate": median}``. Kept free of sluice imports so that tensorflow never becomes sluice's
dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

try:  # imported as part of the package (the doctests import every module)
    from sluice._bench_timing import LARGE_FLOATS, timed
except ImportError:  # run as a script, by path, by an interpreter without sluice
    from _bench_timing import LARGE_FLOATS, timed  # type: ignore[no-redef]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH = 1024
WORKLOADS = ["batched", "large", "tiny"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["dispatcher", "worker", "client"])
    parser.add_argument("--dispatcher")
    parser.add_argument("--workload", choices=WORKLOADS)
    parser.add_argument("--size", type=int)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    import tensorflow as tf

    service = tf.data.experimental.service
    if args.role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=0))
        print(f"READY {server.target}", flush=True)
    elif args.role == "worker":
        address = args.dispatcher.split("://", 1)[-1]
        server = service.WorkerServer(service.WorkerConfig(dispatcher_address=address, port=0))
        print(f"READY {address}", flush=True)
    else:
        rates = [
            _epoch(tf, args.dispatcher, args.workload, args.size)
            for _ in range(max(args.epochs, 1))
        ]
        print(json.dumps({"rate": statistics.median(rates)}), flush=True)
        return 0
    sys.stdin.read()
    server._stop()
    return 0


def _epoch(tf, target: str, workload: str, size: int) -> float:  # type: ignore[no-untyped-def]
    import numpy as np

    if workload == "large":
        dataset = tf.data.Dataset.from_tensors(np.full(LARGE_FLOATS, 0.5, np.float32))
        dataset = dataset.repeat(size)
    elif workload == "batched":
        dataset = tf.data.Dataset.range(size).batch(BATCH)
    else:
        dataset = tf.data.Dataset.range(size)
    dataset = dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs",
            service=target,
            compression=None,
        )
    )
    return timed(dataset.as_numpy_iterator(), workload, size)

if __name__ == "__main__":
    sys.exit(main())
