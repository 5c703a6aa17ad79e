"""Client metrics: reading real elements moves the counters of the read's dataset and job, and
the HTTP server serves the same text."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import Dict

import pytest

import sluice
from sluice.data import Dataset

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def samples(text: str, job: str) -> Dict[str, float]:
    """The samples of `text` whose `job` label is `job`, by metric name (without labels; the
    histogram's `_bucket` samples left out)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and f'job="{job}"' in m["labels"] and not m["name"].endswith("_bucket"):
            out[m["name"]] = out.get(m["name"], 0.0) + float(m["value"])
    return out


def test_reading_an_epoch_counts_its_elements_bytes_and_stalls(cluster):
    job = "metrics-epoch"
    before = samples(sluice.metrics.text(), job)
    assert before == {}  # no series for a job nobody read yet
    ds = Dataset.range(100).apply(
        sluice.distribute("distributed_epoch", cluster.target, job_name=job)
    )
    assert sorted(int(x) for x in ds) == list(range(100))

    after = samples(sluice.metrics.text(), job)
    assert after["sluice_client_received_elements_total"] == 100
    # Each element is one int64 tensor: 8 payload bytes and a header.
    assert after["sluice_client_received_bytes_total"] >= 800
    # The first element cannot be buffered before the epoch starts: at least one wait.
    assert after["sluice_client_stall_seconds_count"] >= 1
    assert after["sluice_client_stall_seconds_sum"] > 0


def test_a_second_epoch_of_the_same_job_adds_to_its_series(cluster):
    job = "metrics-two-epochs"
    ds = Dataset.range(10).apply(sluice.distribute("parallel_epochs", cluster.target, job_name=job))
    assert len(list(ds)) == 20  # two workers, an epoch each
    assert samples(sluice.metrics.text(), job)["sluice_client_received_elements_total"] == 20
    assert len(list(ds)) == 20
    assert samples(sluice.metrics.text(), job)["sluice_client_received_elements_total"] == 40


def test_the_http_server_serves_the_text_at_metrics(cluster):
    job = "metrics-http"
    ds = Dataset.range(7).apply(sluice.distribute("distributed_epoch", cluster.target, job_name=job))
    assert len(list(ds)) == 7
    with sluice.metrics.start_http_server(0, addr="127.0.0.1") as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == sluice.metrics.CONTENT_TYPE
            page = r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=10)
        assert missing.value.code == 404
    assert samples(page, job)["sluice_client_received_elements_total"] == 7
    assert page.endswith("# EOF\n")
    for name in ("received_elements", "received_bytes", "stall_seconds"):
        assert f"# TYPE sluice_client_{name} " in page


def test_a_port_in_use_is_an_os_error():
    with sluice.metrics.start_http_server(0, addr="127.0.0.1") as server:
        with pytest.raises(OSError):
            sluice.metrics.start_http_server(server.port, addr="127.0.0.1")
