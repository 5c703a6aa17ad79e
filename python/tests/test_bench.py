"""`python -m sluice.bench` with tiny sizes: it starts its servers, reads every workload and
prints its figures, so the benchmark cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_prints_a_line_per_figure_and_json_last() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluice.bench", "--no-tf", "--epochs", "1"]
        + ["--tiny", "2000", "--batched", "20480", "--large-mib", "4"],
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    figures = json.loads(lines[-1])
    for name in ("py_tiny_eps", "py_batched_eps", "py_large_mib_s"):
        assert figures[name] > 0, figures
        assert any(line.startswith(name) for line in lines[:-1]), out
    assert not any(name.startswith("tf_") for name in figures), figures
