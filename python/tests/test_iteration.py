"""Iteration: the GIL is released while waiting, Ctrl-C interrupts a blocked next(), iterators
in threads read in parallel, deleting an iterator (or exiting) ends its epoch and releases its
client at the dispatcher."""

from __future__ import annotations

import gc
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import HANG, wait_until

import sluice
from sluice.data import Dataset, TextLineDataset, TFRecordDataset


def test_two_threads_read_two_iterators_in_parallel(cluster):
    results = {}

    def read(name: str) -> None:
        ds = Dataset.range(500).apply(sluice.distribute("distributed_epoch", cluster.target))
        results[name] = sorted(int(x) for x in ds)

    threads = [threading.Thread(target=read, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a reader did not finish within 60 s"
    assert results == {"a": list(range(500)), "b": list(range(500))}


def test_a_blocked_next_releases_the_gil_and_ctrl_c_interrupts_it():
    # No worker: next() waits for one.
    with sluice.DispatchServer() as dispatcher:
        ds = Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target))
        it = iter(ds)
        ticks = []
        stop = threading.Event()

        def tick() -> None:  # runs only if next() released the GIL
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.005)

        ticker = threading.Thread(target=tick)
        ticker.start()

        class Interrupted(Exception):
            pass

        def on_alarm(signum, frame):
            raise Interrupted()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        started = time.monotonic()
        try:
            with pytest.raises(Interrupted):
                next(it)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            stop.set()
            ticker.join(timeout=10)
        assert time.monotonic() - started < 10
        assert len(ticks) > 10
        del it


def test_an_iterator_deleted_mid_epoch_lets_the_next_epoch_start(cluster):
    ds = Dataset.range(10**9).apply(sluice.distribute("distributed_epoch", cluster.target))
    it = iter(ds)
    assert int(next(it)) >= 0
    del it
    gc.collect()
    # The job goes on for other readers: a new epoch reads from the start.
    it2 = iter(ds.take(3))
    assert len(list(it2)) == 3


def test_close_ends_an_epoch_early(cluster):
    ds = Dataset.range(100).apply(sluice.distribute("parallel_epochs", cluster.target))
    it = iter(ds)
    next(it)
    it.close()
    assert list(it) == []


def test_text_and_tfrecord_files(tmp_path, cluster):
    for i in range(3):
        (tmp_path / f"part-{i}.txt").write_text(f"line {i}a\nline {i}b\r\n")
    pattern = str(tmp_path / "*.txt")
    lines = sorted(TextLineDataset(pattern))
    assert lines == [b"line 0a", b"line 0b", b"line 1a", b"line 1b", b"line 2a", b"line 2b"]
    remote = TextLineDataset(pattern).apply(sluice.distribute("distributed_epoch", cluster.target))
    assert sorted(remote) == lines
    names = Dataset.list_files(pattern, shuffle=False)
    assert list(names) == [str(tmp_path / f"part-{i}.txt").encode() for i in range(3)]
    assert sorted(TextLineDataset(Dataset.list_files(pattern))) == lines
    assert list(TextLineDataset([str(tmp_path / "part-2.txt")])) == [b"line 2a", b"line 2b"]
    # A TFRecord file written by hand (length, masked crc32c of it, data, masked crc32c).
    records = [b"first", b"", b"third record"]
    path = tmp_path / "data.tfrecord"
    path.write_bytes(b"".join(_tfrecord(r) for r in records))
    assert list(TFRecordDataset(str(path))) == records


def test_ops_run_locally_as_in_tf_data():
    ds = Dataset.range(20)
    assert [int(x) for x in ds.filter("is_even").map("square").skip(1).take(3)] == [4, 16, 36]
    assert [int(x) for x in ds.shard(5, 2)] == [2, 7, 12, 17]
    assert sorted(int(x) for x in ds.shuffle(20, seed=3)) == list(range(20))
    assert [int(x) for x in Dataset.range(2).repeat(3)] == [0, 1] * 3
    assert [int(x) for x in Dataset.range(3).repeat().take(5)] == [0, 1, 2, 0, 1]
    assert [int(x) for x in Dataset.range(4).prefetch(sluice.data.AUTOTUNE)] == [0, 1, 2, 3]
    assert [int(x) for x in Dataset.range(10, 0, -3)] == [10, 7, 4, 1]
    assert ds.take(-1).cardinality() == 20 and Dataset.range(3).repeat().cardinality() == -1
    assert repr(Dataset.range(3).map("square")) == "<Dataset range(3).map(square)>"


def _masked_crc(data: bytes) -> bytes:
    crc = _crc32c(data)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return masked.to_bytes(4, "little")


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _tfrecord(data: bytes) -> bytes:
    length = len(data).to_bytes(8, "little")
    return length + _masked_crc(length) + data + _masked_crc(data)


def clients_of(dispatcher) -> list:
    """Each iteration's number of clients, as the dispatcher records them."""
    return [it["num_clients"] for it in dispatcher.status()["iterations"]]


def test_a_deleted_iterator_releases_its_client_at_the_dispatcher(cluster):
    ds = Dataset.range(10**9).apply(sluice.distribute("distributed_epoch", cluster.target))
    it = iter(ds)
    next(it)
    assert clients_of(cluster.dispatcher) == [1]
    del it
    gc.collect()
    wait_until(lambda: clients_of(cluster.dispatcher) == [0], "the deleted reader's release")


def test_a_reader_that_exits_mid_epoch_leaves_no_client_behind(cluster):
    # A separate process reads three elements of an endless epoch and exits normally with its
    # iterator still open. The dispatcher's client timeout is minutes: only the reader's own
    # release, sent on its way out, brings the count back to 0 within the wait below.
    reader = (
        "import sys, sluice\n"
        "from sluice.data import Dataset\n"
        "it = iter(Dataset.range(10**9).apply(sluice.distribute('distributed_epoch', sys.argv[1])))\n"
        "print([int(next(it)) >= 0 for _ in range(3)], flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", reader, cluster.target],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, True, True]"
    assert len(clients_of(cluster.dispatcher)) == 1
    wait_until(lambda: clients_of(cluster.dispatcher) == [0], "the exited reader's release", 10)


# A pipeline that yields nothing for as long as anyone waits: even numbers, filtered for odd ones.
NOTHING = Dataset.range(0, 2**50, 2).filter("is_odd")


@pytest.mark.parametrize("where", ["local", "service"])
def test_close_ends_a_next_another_thread_is_waiting_in(cluster, where):  # type: ignore[no-untyped-def]
    ds = NOTHING if where == "local" else NOTHING.apply(
        sluice.distribute("parallel_epochs", cluster.target)
    )
    it = iter(ds)
    ended = queue.Queue()

    def read() -> None:
        try:
            ended.put(("element", next(it)))
        except StopIteration:
            ended.put(("end", None))
        except BaseException as e:  # noqa: BLE001 - the test reports whatever ended it
            ended.put(("error", e))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Running, with nothing to yield.
    with pytest.raises(queue.Empty):
        ended.get(timeout=0.2)
    started = time.process_time()
    it.close()
    # The waiting `next` ends as the epoch's end, and `close` did not spin meanwhile.
    assert ended.get(timeout=HANG) == ("end", None)
    reader.join(HANG)
    assert time.process_time() - started < HANG / 2
    with pytest.raises(StopIteration):
        next(it)


def test_a_process_with_a_thread_waiting_in_next_exits(cluster):  # type: ignore[no-untyped-def]
    """Open epochs are closed at exit; one a daemon thread waits in must not hold the exit."""
    script = textwrap.dedent(
        f"""
        import threading
        import sluice
        from sluice.data import Dataset
        ds = Dataset.range(0, 2**50, 2).filter("is_odd").apply(
            sluice.distribute("parallel_epochs", {cluster.target!r})
        )
        it = iter(ds)
        started = threading.Event()
        def read():
            started.set()
            next(it, None)
        threading.Thread(target=read, daemon=True).start()
        started.wait()
        print("waiting", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "waiting\n"


def test_repeat_after_distribute_reads_the_jobs_next_repetitions(cluster):  # type: ignore[no-untyped-def]
    """``repeat`` after ``distribute`` starts a new epoch of the job per pass, as tf.data's
    does: every pass is a whole epoch (two workers, two copies of each element under
    parallel_epochs; each split once under distributed_epoch), and ops after the repeat see
    every pass."""
    ds = Dataset.range(5).apply(sluice.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in ds.repeat(3)) == sorted(list(range(5)) * 6)
    dynamic = Dataset.range(5).apply(sluice.distribute("distributed_epoch", cluster.target))
    assert sorted(int(x) for x in dynamic.repeat(2).map(lambda x: x * 10)) == sorted(
        [x * 10 for x in range(5)] * 2
    )
    # Repeats nest; an explicit count of 0 yields nothing.
    assert len([int(x) for x in dynamic.repeat(2).repeat(2)]) == 20
    assert list(dynamic.repeat(0)) == []


def test_repeat_forever_after_distribute_reads_on_and_closes_cleanly(cluster):  # type: ignore[no-untyped-def]
    ds = Dataset.range(3).apply(
        sluice.distribute("distributed_epoch", cluster.target, job_name="forever")
    )
    it = iter(ds.repeat())
    got = [int(next(it)) for _ in range(30)]
    assert sorted(set(got)) == [0, 1, 2]
    it.close()
    wait_until(
        lambda: all(i["num_clients"] == 0 for i in cluster.dispatcher.status()["iterations"]),
        "the last pass's reader to be released",
    )


def test_repeat_after_distribute_reads_on_past_empty_epochs(cluster):  # type: ignore[no-untyped-def]
    """A reader that joins a shared job late finds its first repetitions finished (empty
    epochs); a ``repeat()`` after ``distribute`` reads on to the job's live repetition, as
    tf.data's does, and a counted repeat of empty epochs is empty."""

    def shared() -> sluice.data.Dataset:
        return Dataset.range(10).apply(
            sluice.distribute("parallel_epochs", cluster.target, job_name="shared_job")
        )

    first = iter(shared().repeat())
    # Three epochs of two workers.
    assert sorted(int(next(first)) for _ in range(60)) == sorted(list(range(10)) * 6)
    late = iter(shared().repeat())
    # Its first repetitions are over; it reads the ones `first` is not reading.
    assert all(0 <= int(next(late)) < 10 for _ in range(20))
    empty = Dataset.range(0).apply(sluice.distribute("parallel_epochs", cluster.target))
    assert list(empty.repeat(3)) == []
