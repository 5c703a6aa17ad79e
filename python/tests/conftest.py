"""Fixtures: real servers in this process, on port 0, with temporary work dirs."""

from __future__ import annotations

import time
from typing import Callable, Iterator, List, NamedTuple

import pytest

import sluice


class Cluster(NamedTuple):
    dispatcher: sluice.DispatchServer
    workers: List[sluice.WorkerServer]

    @property
    def target(self) -> str:
        return self.dispatcher.target


def start_cluster(num_workers: int, **config: object) -> Cluster:
    """A dispatcher with `config`; its workers read files below the same `data_roots`."""
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(**config))  # type: ignore[arg-type]
    roots = config.get("data_roots")
    workers = [
        sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target, data_roots=roots))  # type: ignore[arg-type]
        for _ in range(num_workers)
    ]
    return Cluster(dispatcher, workers)


def stop_cluster(cluster: Cluster) -> None:
    for server in cluster.workers + [cluster.dispatcher]:
        server.stop()


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """A dispatcher and two workers (the seed's cluster), reading files below the test's
    `tmp_path`."""
    c = start_cluster(2, data_roots=[str(tmp_path)])
    yield c
    stop_cluster(c)


@pytest.fixture
def no_credentials_in_env(monkeypatch):  # type: ignore[no-untyped-def]
    """A clean slate of reader credentials: none of the ``SLUICE_*`` variables a reader takes its
    CA, certificate and token from; returns ``monkeypatch`` to set some."""
    for name in (
        "SLUICE_TLS_CA",
        "SLUICE_TLS_CERT",
        "SLUICE_TLS_KEY",
        "SLUICE_AUTH_TOKEN",
        "SLUICE_AUTH_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


#: Seconds only a hang would take: a test's time bound, never a timing goal.
HANG = 30.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = HANG) -> None:
    """Polls `condition` until it holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
