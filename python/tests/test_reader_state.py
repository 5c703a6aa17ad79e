"""Readers' states: an iterator's ``state_dict()`` resumes an exactly-once epoch where it was
taken, in a new process after the reader was killed, for one reader or several readers of a
job; what cannot be resumed says why."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

import pytest

import sluice
from sluice.data import Dataset
from sluice.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidArgumentValueError,
)

from conftest import HANG, start_cluster, stop_cluster, wait_until


@pytest.fixture(scope="module")
def checking_cluster():  # type: ignore[no-untyped-def]
    """One cluster for the tests of states refused before an epoch starts (no reads)."""
    c = start_cluster(0)
    yield c
    stop_cluster(c)


def reader(target: str, n: int, job: str = "train", **kwargs: object) -> Dataset:
    return Dataset.range(n).apply(
        sluice.distribute(
            "distributed_epoch", target, job_name=job, **kwargs  # type: ignore[arg-type]
        )
    )


# A reader process: reads `before` elements (written to `<out>.before`), takes its state (JSON in
# `<out>.state`), reads `after` more (written to `<out>.after`), says so in `<out>.ready`, and
# waits to be killed.
KILLED_READER = """
import json, os, sys, time
import sluice
from sluice.data import Dataset
target, out = sys.argv[1], sys.argv[5]
n, before, after = (int(a) for a in sys.argv[2:5])
ds = Dataset.range(n).apply(sluice.distribute("distributed_epoch", target, job_name="train"))
it = iter(ds)
taken = [int(next(it)) for _ in range(before)]
state = it.state_dict()
with open(out + ".before", "w") as f:
    json.dump(taken, f)
with open(out + ".state.tmp", "w") as f:
    json.dump(state, f)
os.replace(out + ".state.tmp", out + ".state")
more = [int(next(it)) for _ in range(after)]
with open(out + ".after", "w") as f:
    json.dump(more, f)
with open(out + ".ready", "w") as f:
    f.write("ready")
while True:
    time.sleep(60)
"""

# A reader process that resumes from the state in `<out>.state` and reads the rest of the epoch
# (written to `<out>.rest`).
RESUMING_READER = """
import json, sys
import sluice
from sluice.data import Dataset
target, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(out + ".state") as f:
    state = json.load(f)
ds = Dataset.range(n).apply(sluice.distribute("distributed_epoch", target, job_name="train"))
ds.load_state_dict(state)
rest = [int(x) for x in ds]
with open(out + ".rest", "w") as f:
    json.dump(rest, f)
"""


def test_a_killed_reader_process_resumes_from_its_state_in_a_new_process(cluster, tmp_path):
    n, before, after = 3000, 700, 400
    out = str(tmp_path / "reader")
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_READER, cluster.target, str(n), str(before), str(after), out],
    )
    try:
        wait_until(
            lambda: os.path.exists(out + ".ready") or killed.poll() is not None,
            "the reader to read past its state",
        )
        assert killed.poll() is None, f"the reader exited with {killed.returncode}"
        killed.send_signal(signal.SIGKILL)
        killed.wait(HANG)
    finally:
        if killed.poll() is None:
            killed.kill()
    taken = json.loads(Path(out + ".before").read_text())
    read_after_state = json.loads(Path(out + ".after").read_text())
    assert len(taken) == before and len(read_after_state) == after

    resumed = subprocess.run(
        [sys.executable, "-c", RESUMING_READER, cluster.target, str(n), out],
        capture_output=True,
        text=True,
        timeout=HANG * 2,
    )
    assert resumed.returncode == 0, resumed.stderr
    rest = json.loads(Path(out + ".rest").read_text())
    # Each element once: those read before the state, and everything else after the restore,
    # including what the killed reader had read after its state.
    assert sorted(taken + rest) == list(range(n))
    assert set(read_after_state) <= set(rest)


def test_four_readers_stopped_at_one_step_resume_as_two(cluster):
    n, step, readers = 4000, 150, 4
    states: List[dict] = [{}] * readers
    taken: List[List[int]] = [[] for _ in range(readers)]
    errors: List[BaseException] = []
    started = threading.Barrier(readers, timeout=HANG)

    def first_run(k: int) -> None:
        try:
            # One dataset object per reader, as in separate processes (a dataset object counts
            # its epochs).
            it = iter(reader(cluster.target, n))
            started.wait()
            taken[k] = [int(next(it)) for _ in range(step)]
            states[k] = it.state_dict()
            it.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_run, args=(k,)) for k in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert not errors, errors
    assert all(s["step"] == step for s in states), states
    assert len({s["reader"] for s in states}) == readers

    # Two new readers restore from two of the four states: both join one restored epoch (both
    # start before either reads, so neither finds it finished).
    rest: List[List[int]] = [[], []]
    joined = threading.Barrier(2, timeout=HANG)

    def second_run(k: int) -> None:
        try:
            ds = reader(cluster.target, n)
            ds.load_state_dict(states[k + 2])
            it = iter(ds)
            joined.wait()
            rest[k] = [int(x) for x in it]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=second_run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG * 2)
    assert not errors, errors
    everything = [x for part in taken + rest for x in part]
    assert sorted(everything) == list(range(n))


def test_an_iterator_restarts_at_a_state_it_is_given(cluster):
    n = 1000
    it = iter(reader(cluster.target, n))
    taken = [int(next(it)) for _ in range(300)]
    state = it.state_dict()
    assert state["step"] == 300
    # Read more, then go back to the state: those are delivered again, nothing else twice.
    more = [int(next(it)) for _ in range(200)]
    it.load_state_dict(state)
    rest = [int(x) for x in it]
    assert sorted(taken + rest) == list(range(n))
    assert set(more) <= set(rest)


def test_the_state_counts_only_what_next_returned(cluster):
    # A few elements are buffered ahead of the caller; the state's step is what it received.
    it = iter(reader(cluster.target, 500, max_outstanding_requests=64))
    first = [int(next(it)) for _ in range(5)]
    state = it.state_dict()
    assert state["step"] == 5
    it.close()
    ds = reader(cluster.target, 500)
    ds.load_state_dict(state)
    assert sorted(first + [int(x) for x in ds]) == list(range(500))


def test_a_state_is_plain_small_and_survives_json_and_pickle(cluster):
    it = iter(reader(cluster.target, 100))
    for _ in range(10):
        next(it)
    state = it.state_dict()
    assert set(state) == {"format", "dataset", "job", "epoch", "step", "reader"}
    assert all(type(v) in (int, str) for v in state.values()), state
    assert state["format"] == 1 and state["job"] == "train"
    assert (state["epoch"], state["step"]) == (0, 10)
    assert re.fullmatch(r"[0-9a-f]{64}", state["dataset"])
    text = json.dumps(state)
    assert len(text) < 256, text
    assert json.loads(text) == state
    assert pickle.loads(pickle.dumps(state)) == state
    # The same size later in the epoch.
    for _ in range(80):
        next(it)
    later = it.state_dict()
    assert later["step"] == 90 and len(json.dumps(later)) == len(text)
    it.close()
    ds = reader(cluster.target, 100)
    ds.load_state_dict(json.loads(json.dumps(later)))
    assert len(list(ds)) == 10


def test_readers_that_cannot_take_a_state_say_why(cluster):
    anonymous = iter(
        Dataset.range(100).apply(sluice.distribute("distributed_epoch", cluster.target))
    )
    next(anonymous)
    with pytest.raises(FailedPreconditionError, match="needs a named job"):
        anonymous.state_dict()

    at_most_once = iter(reader(cluster.target, 100, job="amo", delivery="at_most_once"))
    next(at_most_once)
    with pytest.raises(FailedPreconditionError, match="delivers at most once"):
        at_most_once.state_dict()

    batched = reader(cluster.target, 100, job="batched").batch(4)
    it = iter(batched)
    next(it)
    with pytest.raises(FailedPreconditionError, match=r"ops after `distribute` \(batch"):
        it.state_dict()
    with pytest.raises(FailedPreconditionError, match="ops after `distribute`"):
        batched.load_state_dict(_a_state())

    local = Dataset.range(10)
    with pytest.raises(FailedPreconditionError, match="iterated in this process"):
        iter(local).state_dict()
    with pytest.raises(FailedPreconditionError, match="iterated in this process"):
        local.load_state_dict(_a_state())

    ended = iter(reader(cluster.target, 3, job="short"))
    assert len(list(ended)) == 3
    with pytest.raises(FailedPreconditionError, match="epoch has ended"):
        ended.state_dict()


def _a_state(**changes: object) -> dict:
    state = {
        "format": 1,
        "dataset": "ab" * 32,
        "job": "train",
        "epoch": 0,
        "step": 10,
        "reader": "7",
    }
    state.update(changes)
    return state


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("step"), r"has no 'step' \(of type int\)"),
        (lambda s: s.pop("dataset"), r"has no 'dataset' \(of type str\)"),
        (lambda s: s.update(epoch="0"), r"'epoch' must be a non-negative int, got str '0'"),
        (lambda s: s.update(step=-1), r"'step' must be a non-negative int"),
        (lambda s: s.update(step=True), r"'step' must be a non-negative int, got bool"),
        (lambda s: s.update(reader=7), r"'reader' must be a str, got int"),
        (lambda s: s.update(dataset="not hex"), r"'dataset' must be the hexadecimal key"),
        (lambda s: s.update(extra=1), r"unknown key 'extra'"),
        (lambda s: s.update(job=""), r"'job' must not be empty"),
        (lambda s: s.update(format=2), r"has format 2, newer than this client's 1"),
        (lambda s: s.update(job="eval"), r"of job 'eval', and this dataset reads job 'train'"),
    ],
)
def test_a_bad_state_is_refused_naming_what_is_wrong(checking_cluster, change, message):
    ds = reader(checking_cluster.target, 100)
    state = _a_state()
    change(state)
    with pytest.raises(InvalidArgumentError, match=message):
        ds.load_state_dict(state)


def test_a_state_that_is_no_dict_is_refused(checking_cluster):
    target = checking_cluster.target
    with pytest.raises(InvalidArgumentValueError, match="a dict as `state_dict\\(\\)` returns"):
        reader(target, 100).load_state_dict([("step", 1)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="reads no named job"):
        Dataset.range(100).apply(
            sluice.distribute("distributed_epoch", target)
        ).load_state_dict(_a_state())


def test_a_step_never_taken_is_not_found(cluster):
    it = iter(reader(cluster.target, 100))
    next(it)
    state = it.state_dict()
    it.close()
    ds = reader(cluster.target, 100)
    ds.load_state_dict(dict(state, step=state["step"] + 5))
    with pytest.raises(sluice.errors.NotFoundError, match="no state of job 'train' at step 6"):
        iter(ds)


def test_a_state_of_another_dataset_under_the_same_job_name_is_refused():
    cluster = start_cluster(2, job_gc_timeout_ms=200)
    try:
        it = iter(reader(cluster.target, 100))
        next(it)
        state = it.state_dict()
        assert len(list(it)) == 99
        # The epoch ended and its reader is gone: the job is collected, its states are kept.
        wait_until(
            lambda: not cluster.dispatcher.status()["jobs"], "the job's garbage collection"
        )
        other = reader(cluster.target, 200)
        other.load_state_dict(state)
        with pytest.raises(InvalidArgumentError) as raised:
            iter(other)
        text = str(raised.value)
        named = re.findall(r"definition ([0-9a-f]{64})", text)
        assert len(named) == 2 and named[0] == state["dataset"] != named[1], text
        # The dataset the state was taken from resumes from it, once the other's job is gone.
        wait_until(
            lambda: not cluster.dispatcher.status()["jobs"], "the other job's garbage collection"
        )
        same = reader(cluster.target, 100)
        same.load_state_dict(state)
        assert len(list(same)) == 99
    finally:
        stop_cluster(cluster)


def distributed(target: str, n: int, pipelines: int = 1) -> sluice.DistributedDataset:
    strategy = sluice.DistributeStrategy(2, num_input_pipelines=pipelines)
    ds = Dataset.range(n).batch(4).apply(
        sluice.distribute("distributed_epoch", target, job_name="dist")
    )
    return strategy.experimental_distribute_dataset(ds)


def rows(steps) -> List[int]:  # type: ignore[no-untyped-def]
    return [int(x) for step in steps for value in step for x in value]


def test_a_distributed_iterator_resumes_from_its_state(cluster):
    n = 400
    it = iter(distributed(cluster.target, n))
    taken = rows(next(it) for _ in range(20))
    state = it.state_dict()
    assert state["step"] == 20  # one global batch per step
    rows(next(it) for _ in range(10))
    it.close()
    dist = distributed(cluster.target, n)
    dist.load_state_dict(state)
    assert sorted(taken + rows(dist)) == list(range(n))


def test_a_distributed_iterator_takes_states_between_input_elements_only(cluster):
    # Two input pipelines: each global batch makes two steps of this pipeline.
    it = iter(distributed(cluster.target, 400, pipelines=2))
    next(it)
    with pytest.raises(FailedPreconditionError, match="every W steps"):
        it.state_dict()
    next(it)
    assert it.state_dict()["step"] == 1
    local = sluice.DistributeStrategy(2).experimental_distribute_dataset(
        Dataset.range(8).batch(4)
    )
    with pytest.raises(FailedPreconditionError, match="over a local pipeline"):
        iter(local).state_dict()
    with pytest.raises(FailedPreconditionError, match="over a local pipeline"):
        local.load_state_dict(_a_state())


def test_a_dataset_read_by_id_resumes_from_its_state(cluster):
    dataset_id = sluice.register_dataset(cluster.target, Dataset.range(500), dataset_id="r500")

    def by_id() -> Dataset:
        return sluice.from_dataset_id(
            "distributed_epoch", cluster.target, dataset_id, job_name="by-id"
        )

    it = iter(by_id())
    taken = [int(next(it)) for _ in range(120)]
    state = it.state_dict()
    it.close()
    ds = by_id()
    ds.load_state_dict(json.loads(json.dumps(state)))
    assert sorted(taken + [int(x) for x in ds]) == list(range(500))
