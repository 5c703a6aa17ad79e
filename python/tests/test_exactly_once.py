"""Exactly-once delivery: a worker that stops mid-epoch loses nothing its readers had not
received, and repeats nothing they had; tf.data's at-most-once stays available."""

from __future__ import annotations

import pytest

import sluice
from sluice.data import Dataset

from conftest import start_cluster, stop_cluster


def test_a_worker_stopped_mid_epoch_loses_and_repeats_nothing():
    # A short worker timeout, so the stopped worker's task moves soon.
    cluster = start_cluster(2, worker_timeout_ms=1000)
    try:
        n = 4000
        ds = Dataset.range(n).apply(
            sluice.distribute(
                "distributed_epoch", cluster.target, max_outstanding_requests=4
            )
        )
        it = iter(ds)
        seen = [int(next(it)) for _ in range(500)]
        # Both workers hold elements in their buffers, leased and not yet read.
        cluster.workers[0].stop()
        seen.extend(int(x) for x in it)
        assert sorted(seen) == list(range(n))
    finally:
        stop_cluster(cluster)


def test_a_worker_stopped_mid_epoch_of_a_zip_of_two_ranges_loses_and_repeats_nothing():
    # Two split providers: the task that takes the stopped worker's stream over must feed each
    # range its own recorded splits, or it would pair other elements (or the same ones again).
    # The second range is longer than the leases its workers can hold ahead, so every split of
    # the first is paired: a zip ends on its first input.
    cluster = start_cluster(2, worker_timeout_ms=1000)
    try:
        n = 3000
        ds = Dataset.zip(Dataset.range(n), Dataset.range(n, 6 * n)).apply(
            sluice.distribute(
                "distributed_epoch", cluster.target, max_outstanding_requests=4
            )
        )
        it = iter(ds)
        seen = [(int(a), int(b)) for a, b in (next(it) for _ in range(400))]
        # Both workers hold pairs in their buffers, leased and not yet read.
        cluster.workers[0].stop()
        seen.extend((int(a), int(b)) for a, b in it)
        assert sorted(a for a, _ in seen) == list(range(n))
        seconds = [b for _, b in seen]
        assert len(set(seconds)) == len(seconds) and set(seconds) <= set(range(n, 6 * n))
    finally:
        stop_cluster(cluster)


def test_delivery_is_named_and_checked(cluster):
    at_most_once = Dataset.range(10).apply(
        sluice.distribute("distributed_epoch", cluster.target, delivery="at_most_once")
    )
    assert sorted(int(x) for x in at_most_once) == list(range(10))
    with pytest.raises(sluice.errors.InvalidArgumentError, match="invalid delivery 'twice'"):
        Dataset.range(3).apply(
            sluice.distribute("distributed_epoch", cluster.target, delivery="twice")
        )
    with pytest.raises(ValueError, match="`delivery` must be"):
        sluice.distribute("distributed_epoch", cluster.target, delivery=1)


def test_a_named_job_keeps_its_delivery(cluster):
    def reader(delivery: str) -> Dataset:
        return Dataset.range(10).apply(
            sluice.distribute(
                "distributed_epoch", cluster.target, job_name="kept", delivery=delivery
            )
        )

    iter(reader("exactly_once"))
    with pytest.raises(sluice.errors.InvalidArgumentError, match="Existing delivery"):
        iter(reader("at_most_once"))
