"""tf.data's side of ``python -m sluice.bench_images``, run as a script by an interpreter that has
tensorflow (which need not have sluice): ``python _tf_images_bench.py --root DIR --images N
--side S --epochs K --batch B``.

Reads the files the benchmark wrote below ``DIR`` (``plain/*.tfrecord`` and GZIP-compressed
``gzip/*.tfrecord``) with ``TFRecordDataset`` and one ``map`` of ``tf.io.parse_single_example``
and ``tf.io.decode_jpeg``, once with ``num_parallel_calls`` unset and once with ``AUTOTUNE``, and
batches the images by ``B`` unless it is 0, and prints ``{"plain_tf_seq": seconds, ...}`` (the median epoch of each). Kept free of sluice
imports so that tensorflow never becomes sluice's dependency.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

COMPRESSIONS = {"plain": None, "gzip": "GZIP"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--images", type=int, required=True)
    parser.add_argument("--side", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0)
    args = parser.parse_args()
    import tensorflow as tf

    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):  # type: ignore[no-untyped-def]
        example = tf.io.parse_single_example(record, features)
        return {"image": tf.io.decode_jpeg(example["image"], channels=3), "label": example["label"]}

    seconds = {}
    for name, compression in COMPRESSIONS.items():
        files = sorted(glob.glob(os.path.join(args.root, name, "*.tfrecord")))
        for how, calls in (("tf_seq", None), ("tf_auto", tf.data.AUTOTUNE)):

            def epoch() -> float:
                ds = tf.data.TFRecordDataset(files, compression_type=compression)
                ds = ds.map(parse, num_parallel_calls=calls)
                if args.batch:
                    ds = ds.batch(args.batch)
                count = 0
                started = time.perf_counter()
                for element in ds.as_numpy_iterator():
                    shape = element["image"].shape
                    count += 1 if len(shape) == 3 else shape[0]
                    if shape[-3:] != (args.side, args.side, 3):
                        raise RuntimeError(f"images of shape {shape}")
                took = time.perf_counter() - started
                if count != args.images:
                    raise RuntimeError(f"read {count} of {args.images} records")
                return took

            seconds[f"{name}_{how}"] = statistics.median(
                epoch() for _ in range(max(args.epochs, 1))
            )
    print(json.dumps(seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
