"""``python -m sluice.bench_images``: ``parse_example`` + ``decode_image`` on TFRecord files of
JPEGs, beside tf.data reading the same files in its own process.

The benchmark writes ``--images`` JPEGs (``--side`` x ``--side`` x 3, a colour gradient under
seeded noise, so the encoder has real content to code; written by Pillow if it is importable,
else by the ``image`` crate's encoder) as ``tf.train.Example`` records ``{image: bytes, label: int64}`` into
``--files`` TFRecord files, once plain and once GZIP-compressed. Then, for each compression:

- ``local``: sluice's pipeline ``TFRecordDataset(...).parse_example(...)
  .decode_image(key="image")`` iterated in this process;
- ``worker``: the same pipeline read through one worker (``parallel_epochs``, dispatcher and
  worker in their own processes, ``python -m sluice.bench serve ...``);
- ``tf_seq`` and ``tf_auto``: tf.data's ``TFRecordDataset`` + ``map(parse_single_example,
  decode_jpeg)`` with ``num_parallel_calls`` unset and ``AUTOTUNE``, run by ``_tf_images_bench.py``
  under an interpreter with tensorflow (this one, or ``--tf-python``), when there is one.

With ``--batch B`` both sides batch the decoded images by ``B`` before Python sees them, which
takes the per-element cost of each side's Python iterator out of the figures.

Each figure is the median of ``--epochs`` epochs, each timed from creating the iterator to the
end of input (a new job per epoch through the worker). Records/s, and MiB/s of the files' bytes
on disk; ratios are sluice over tf.data's sequential map. One line per figure, then a JSON object
of every figure on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from sluice.bench import _Child, _tf_interpreter

TF_SCRIPT = Path(__file__).with_name("_tf_images_bench.py")
COMPRESSIONS = {"plain": None, "gzip": "GZIP"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    return _bench(_parser().parse_args(argv))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.bench_images", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--images", type=int, default=2000, help="JPEGs written")
    parser.add_argument("--side", type=int, default=64, help="height and width of each JPEG")
    parser.add_argument("--files", type=int, default=4, help="TFRecord files per compression")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per figure (median)")
    parser.add_argument(
        "--batch", type=int, default=0, help="batch the decoded images on both sides (0: none)"
    )
    parser.add_argument("--dir", help="where to write the files (default: a temporary dir)")
    parser.add_argument(
        "--tf-python",
        help="a Python interpreter with tensorflow for tf.data's side "
        "(default: this one, if it imports tensorflow)",
    )
    parser.add_argument("--no-tf", action="store_true", help="measure sluice only")
    return parser


def _jpegs(n: int, side: int) -> List[bytes]:
    """`n` JPEGs of a gradient under seeded noise, quality 90."""
    import numpy as np

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    arrays = []
    for i in range(n):
        base = np.stack(
            [
                ramp[None, :].repeat(side, 0),
                ramp[:, None].repeat(side, 1),
                np.full((side, side), i % 256, np.float32),
            ],
            axis=-1,
        )
        noisy = base + rng.normal(0, 24, (side, side, 3))
        arrays.append(np.clip(noisy, 0, 255).astype(np.uint8))
    try:
        import io

        from PIL import Image

        def encode(a: Any) -> bytes:
            out = io.BytesIO()
            Image.fromarray(a).save(out, format="JPEG", quality=90)
            return out.getvalue()

    except ImportError:
        from sluice import _native

        def encode(a: Any) -> bytes:
            return _native.encode_jpeg(a.tobytes(), side, side, 90)

    return [encode(a) for a in arrays]


def _write_files(root: Path, jpegs: List[bytes], files: int) -> Dict[str, int]:
    """Writes every compression's files below `root`; returns the bytes on disk of each."""
    from sluice.io import TFRecordWriter, serialize_example

    sizes = {}
    for name, compression in COMPRESSIONS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        paths = [root / name / f"images-{f:03}.tfrecord" for f in range(files)]
        writers = [TFRecordWriter(str(p), compression) for p in paths]
        for i, jpeg in enumerate(jpegs):
            writers[i % files].write(serialize_example({"image": jpeg, "label": i}))
        for w in writers:
            w.close()
        sizes[name] = sum(p.stat().st_size for p in paths)
    return sizes


def _dataset(pattern: str, compression: Optional[str], batch: int):  # type: ignore[no-untyped-def]
    import numpy as np

    from sluice.data import TFRecordDataset
    from sluice.io import FixedLenFeature

    features = {"image": FixedLenFeature((), bytes), "label": FixedLenFeature((), np.int64)}
    ds = (
        TFRecordDataset(pattern, compression_type=compression)
        .parse_example(features)
        .decode_image(key="image")
    )
    return ds.batch(batch) if batch else ds


def _epoch(make: Callable[[], Any], n: int, side: int) -> float:
    """Reads one epoch of `make()`'s elements (images, or batches of them); returns its
    seconds, after checking it read `n` images of the right shape."""
    count = 0
    started = time.perf_counter()
    for element in make():
        shape = element["image"].shape
        count += 1 if len(shape) == 3 else shape[0]
        if shape[-3:] != (side, side, 3):
            raise RuntimeError(f"images of shape {shape}")
    seconds = time.perf_counter() - started
    if count != n:
        raise RuntimeError(f"read {count} of {n} records")
    return seconds


def _bench(args: argparse.Namespace) -> int:
    import sluice

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(os.path.realpath(args.dir or scratch))
        jpegs = _jpegs(args.images, args.side)
        disk = _write_files(root, jpegs, args.files)
        n, epochs = args.images, max(args.epochs, 1)
        mib = {name: size / (1 << 20) for name, size in disk.items()}
        seconds: Dict[str, float] = {}
        for name, compression in COMPRESSIONS.items():
            pattern = str(root / name / "*.tfrecord")
            ds = _dataset(pattern, compression, args.batch)
            seconds[f"{name}_local"] = statistics.median(
                _epoch(lambda: iter(ds), n, args.side) for _ in range(epochs)
            )
        dispatcher = _Child(
            [sys.executable, "-m", "sluice.bench", "serve", "dispatcher"]
            + ["--data-root", str(root)]
        )
        children = [dispatcher]
        try:
            children.append(
                _Child(
                    [sys.executable, "-m", "sluice.bench", "serve", "worker"]
                    + ["--dispatcher", dispatcher.address, "--data-root", str(root)]
                )
            )
            for name, compression in COMPRESSIONS.items():
                pattern = str(root / name / "*.tfrecord")
                remote = _dataset(pattern, compression, args.batch).apply(
                    sluice.distribute("parallel_epochs", dispatcher.address, compression=None)
                )
                seconds[f"{name}_worker"] = statistics.median(
                    _epoch(lambda: iter(remote), n, args.side) for _ in range(epochs)
                )
        finally:
            for child in reversed(children):
                child.stop()
        tf_python = None if args.no_tf else _tf_interpreter(args.tf_python)
        if tf_python is not None:
            seconds.update(_tf_seconds(tf_python, root, args, epochs))
        else:
            print("tf.data: not measured (no interpreter with tensorflow)", flush=True)
    return _report(seconds, n, mib, args)


def _tf_seconds(python: str, root: Path, args: Any, epochs: int) -> Dict[str, float]:
    out = subprocess.run(
        [python, str(TF_SCRIPT), "--root", str(root), "--images", str(args.images)]
        + ["--side", str(args.side), "--epochs", str(epochs), "--batch", str(args.batch)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tf.data's side failed: {out.stderr[-2000:]}")
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def _report(seconds: Dict[str, float], n: int, mib: Dict[str, float], args: Any) -> int:
    figures: Dict[str, Any] = {
        "images": n,
        "side": args.side,
        "batch": args.batch,
        "load_1min": round(os.getloadavg()[0], 2),
    }
    for name in COMPRESSIONS:
        figures[f"{name}_mib"] = round(mib[name], 2)
        tf_seq = seconds.get(f"{name}_tf_seq")
        for how in ("local", "worker", "tf_seq", "tf_auto"):
            key = f"{name}_{how}"
            if key not in seconds:
                continue
            rps, mibps = n / seconds[key], mib[name] / seconds[key]
            figures[f"{key}_records_s"] = round(rps, 1)
            figures[f"{key}_mib_s"] = round(mibps, 2)
            line = f"{key:<14} {rps:>10,.0f} records/s {mibps:>8,.1f} MiB/s"
            if tf_seq is not None and how in ("local", "worker", "tf_auto"):
                ratio = tf_seq / seconds[key]
                figures[f"{key}_over_tf_seq"] = round(ratio, 2)
                line += f"   {ratio:,.2f}x tf.data sequential"
            print(line, flush=True)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
