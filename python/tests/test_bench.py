"""`python -m sluice.bench`, `python -m sluice.bench_images` and `python -m sluice.map_bench`
with tiny sizes: each starts its servers, reads every workload and prints its figures, so the
benchmarks cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys


def run(module: str, *args: str, timeout: float = 120) -> "tuple[list, dict]":
    """Runs ``python -m module args``; its output lines, and the JSON object of its last."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_bench_prints_a_line_per_figure_and_json_last() -> None:
    lines, figures = run(
        "sluice.bench", "--no-tf", "--epochs", "1",
        "--tiny", "2000", "--batched", "20480", "--large-mib", "4",
    )
    for name in ("py_tiny_eps", "py_batched_eps", "py_large_mib_s"):
        assert figures[name] > 0, figures
        assert any(line.startswith(name) for line in lines[:-1]), lines
    assert not any(name.startswith("tf_") for name in figures), figures


def test_image_bench_reads_every_record_locally_and_through_a_worker(tmp_path) -> None:
    lines, figures = run(
        "sluice.bench_images", "--no-tf", "--epochs", "1",
        "--images", "40", "--side", "16", "--files", "2", "--dir", str(tmp_path),
    )
    for name in ("plain_local", "plain_worker", "gzip_local", "gzip_worker"):
        assert figures[f"{name}_records_s"] > 0, figures
        assert any(line.startswith(name) for line in lines[:-1]), lines
    assert not any("tf_" in name for name in figures), figures


def test_map_bench_reads_every_element_of_each_workload_in_each_setup() -> None:
    lines, figures = run("sluice.map_bench", "--epochs", "1", "--images", "24", timeout=180)
    for workload in ("tiny", "image", "augment"):
        for setup in ("loop", "pool", "sluice"):
            name = f"py_map_{workload}_{setup}_eps"
            assert figures[name] > 0, figures
            assert any(line.startswith(name) for line in lines[:-1]), lines
        assert figures[f"{workload}_sluice_vs_pool"] > 0, figures
        assert figures[f"{workload}_sluice_vs_loop"] > 0, figures


def test_map_bench_reads_with_distributes_default_compression() -> None:
    _, figures = run(
        "sluice.map_bench",
        *("--epochs", "1", "--images", "24", "--workloads", "image", "--compression", "auto"),
        timeout=180,
    )
    assert figures["compression"] == "auto", figures
    assert figures["py_map_image_sluice_eps"] > 0, figures


def test_map_bench_measures_each_sluice_process_cpu_per_element() -> None:
    lines, figures = run(
        "sluice.map_bench",
        *("--epochs", "1", "--images", "24", "--workloads", "augment", "--cpu"),
        timeout=180,
    )
    for process in ("reader", "worker", "executors", "dispatcher"):
        assert figures[f"augment_sluice_cpu_us_{process}"] >= 0, figures
    # The function runs a few milliseconds per element, in the executors and nowhere else.
    assert figures["augment_sluice_cpu_us_executors"] > 500, figures
    assert any(line.startswith("augment: CPU µs per element") for line in lines), lines
