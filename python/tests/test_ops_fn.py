"""The ops that take functions making datasets or deciding where a dataset ends: ``interleave``
(native templates traced from the function, or the function run in Python) and ``take_while``,
locally and through a real dispatcher and two workers."""

from __future__ import annotations

import collections
from typing import Any, List

import numpy as np
import pytest

import sluice
from sluice.data import AUTOTUNE, Dataset, TextLineDataset, TFRecordDataset
from sluice.errors import InvalidArgumentError
from sluice.io import TFRecordWriter


def ints(ds: Any) -> List[int]:
    return [int(x) for x in ds]


def tf_interleave(inners: List[List[Any]], cycle: int, block: int) -> List[Any]:
    """tf.data's interleave order, element by element (its documented algorithm)."""
    source = iter(inners)
    slots: List[Any] = [None] * cycle
    index = taken = open_ = 0
    done = False
    out: List[Any] = []
    while True:
        if slots[index] is not None:
            try:
                out.append(next(slots[index]))
                taken += 1
                if taken == block:
                    taken, index = 0, (index + 1) % cycle
            except StopIteration:
                slots[index] = None
                open_ -= 1
                taken, index = 0, (index + 1) % cycle
        elif not done:
            inner = next(source, None)
            if inner is None:
                done = True
            else:
                slots[index] = iter(inner)
                open_ += 1
        elif open_ == 0:
            return out
        else:
            taken, index = 0, (index + 1) % cycle


def test_the_documented_example_and_tf_data_order_for_cycle_and_block_lengths():
    # tf.data's documentation: range(1, 6), each x repeated 6 times, cycle 2, block 4.
    rows = np.repeat(np.arange(1, 6)[:, None], 6, axis=1)
    ds = Dataset.from_tensor_slices(rows).interleave(
        Dataset.from_tensor_slices, cycle_length=2, block_length=4
    )
    assert ints(ds) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                        3, 3, 4, 4, 5, 5, 5, 5, 5, 5]  # fmt: skip
    counts = [3, 0, 5, 1, 4]
    inners = [[i] * n for i, n in enumerate(counts)]
    for cycle in (1, 2, 3, 7):
        for block in (1, 2, 4):
            want = tf_interleave(inners, cycle, block)
            for parallel in (None, 1, AUTOTUNE):
                # A Python function: each element's list is its inner dataset.
                ds = Dataset.range(len(counts)).interleave(
                    lambda i: [int(i)] * counts[int(i)],
                    cycle_length=cycle,
                    block_length=block,
                    num_parallel_calls=parallel,
                )
                assert ints(ds) == want, (cycle, block, parallel)


def write_files(tmp_path, n: int, lines: int) -> List[str]:
    paths = []
    for f in range(n):
        path = tmp_path / f"part-{f}.txt"
        path.write_text("".join(f"{f}:{i}\n" for i in range(lines + f)))
        paths.append(str(path))
    return paths


def write_records(tmp_path, n: int, records: int) -> List[str]:
    paths = []
    for f in range(n):
        path = str(tmp_path / f"part-{f}.tfrecord")
        with TFRecordWriter(path) as w:
            for i in range(records):
                w.write(f"{f}:{i}".encode())
        paths.append(path)
    return paths


def test_files_are_read_by_a_native_template(tmp_path):
    paths = write_files(tmp_path, 3, 2)
    files = Dataset.list_files(str(tmp_path / "*.txt"), shuffle=False)
    ds = files.interleave(TextLineDataset, cycle_length=2, num_parallel_calls=AUTOTUNE)
    # Traced once: the template is native (rendered with its element source).
    assert "interleave(element_lines()" in repr(ds)
    inners = [open(p, "rb").read().splitlines() for p in paths]
    assert list(ds) == tf_interleave(inners, 2, 1)
    records = write_records(tmp_path, 2, 3)
    ds = Dataset.from_tensor_slices(records).interleave(
        lambda f: TFRecordDataset(f).map(lambda r: r + b"!"), cycle_length=2
    )
    assert list(ds) == [b"0:0!", b"1:0!", b"0:1!", b"1:1!", b"0:2!", b"1:2!"]


def test_a_function_that_uses_its_element_otherwise_runs_in_python():
    ds = Dataset.range(3).interleave(lambda x: Dataset.range(int(x) + 1), cycle_length=3)
    assert '.interleave("test_ops_fn.' in repr(ds)
    assert ints(ds) == [0, 0, 0, 1, 1, 2]
    # A tuple element's parts are its positional arguments.
    pairs = Dataset.from_tensor_slices(([1, 2], [10, 20]))
    assert ints(pairs.interleave(lambda a, b: [a, b], cycle_length=2)) == [1, 2, 10, 20]


def test_interleave_arguments_are_checked_with_tf_data_texts():
    ds = Dataset.range(3)
    with pytest.raises(InvalidArgumentError, match="cycle_length must be greater than zero."):
        ds.interleave(Dataset.from_tensor_slices, cycle_length=0)
    with pytest.raises(InvalidArgumentError, match="block_length must be greater than zero."):
        ds.interleave(Dataset.from_tensor_slices, block_length=0)
    with pytest.raises(InvalidArgumentError, match="num_parallel_calls"):
        ds.interleave(Dataset.from_tensor_slices, num_parallel_calls=-5)
    with pytest.raises(InvalidArgumentError, match="takes a Python callable"):
        ds.interleave("square")  # type: ignore[arg-type]
    # A scalar element cannot be sliced: refused when the template is built.
    with pytest.raises(InvalidArgumentError, match="rank at least 1"):
        ds.interleave(Dataset.from_tensor_slices)


def test_take_while_with_a_python_predicate_and_a_builtin_one():
    assert ints(Dataset.range(10).take_while(lambda x: x < 4)) == [0, 1, 2, 3]
    assert ints(Dataset.range(10).take_while("is_even")) == [0]
    assert ints(Dataset.range(5).repeat().take_while(lambda x: x < 3)) == [0, 1, 2]
    assert ints(Dataset.range(3).take_while(lambda x: False)) == []
    assert Dataset.range(3).take_while("is_even").cardinality() == -2


@pytest.fixture
def two_workers(tmp_path):
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(data_roots=[str(tmp_path)]))
    workers = [
        sluice.WorkerServer(
            sluice.WorkerConfig(
                dispatcher.target, data_roots=[str(tmp_path)], python_executors=2
            )
        )
        for _ in range(2)
    ]
    yield dispatcher.target
    for server in workers + [dispatcher]:
        server.stop()


def test_interleaved_files_through_the_service(tmp_path, two_workers):
    paths = write_records(tmp_path, 6, 5)
    files = Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False)
    ds = files.interleave(TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    every = sorted(f"{f}:{i}".encode() for f in range(len(paths)) for i in range(5))
    # parallel_epochs: each worker reads the whole dataset, in tf.data's order.
    got = list(ds.apply(sluice.distribute("parallel_epochs", two_workers)))
    assert sorted(got) == sorted(every * 2)
    per_file = collections.defaultdict(list)
    for r in got:
        per_file[r.split(b":")[0]].append(r)
    assert all(len(v) == 10 for v in per_file.values())
    # distributed_epoch: the splits are the files; each record once.
    got = list(ds.apply(sluice.distribute("distributed_epoch", two_workers)))
    assert sorted(got) == every
    # A Python function on the workers' executors, and a take_while after it.
    lines = write_files(tmp_path, 3, 4)
    py = Dataset.from_tensor_slices(lines).interleave(
        lambda f: [line.strip() for line in open(f.decode(), "rb")], cycle_length=3
    )
    got = list(py.apply(sluice.distribute("distributed_epoch", two_workers)))
    assert sorted(got) == sorted(
        line for p in lines for line in open(p, "rb").read().splitlines()
    )
    # After distribute, in this process: a template over the elements read.
    names = Dataset.from_tensor_slices(paths[:2]).apply(
        sluice.distribute("distributed_epoch", two_workers)
    )
    here = names.interleave(TFRecordDataset, cycle_length=2)
    assert sorted(here) == [f"{f}:{i}".encode() for f in range(2) for i in range(5)]
    short = Dataset.range(100).take_while(lambda x: x < 7)
    assert sorted(ints(short.apply(sluice.distribute("parallel_epochs", two_workers)))) == sorted(
        list(range(7)) * 2
    )


def test_from_generator_streams_a_generator_here():
    def count(n):
        yield from range(n)

    spec = sluice.data.TensorSpec((), "int64")
    ds = Dataset.from_generator(count, args=(5,), output_signature=spec)
    assert ints(ds) == [0, 1, 2, 3, 4]
    assert ds.element_spec == spec
    # Read as it goes: an endless generator with a take, and every repeat runs it again.
    def forever():
        i = 0
        while True:
            yield np.int64(i)
            i += 1

    endless = Dataset.from_generator(forever, output_types=np.int64, output_shapes=())
    assert ints(endless.take(3000))[-3:] == [2997, 2998, 2999]
    assert ints(Dataset.from_generator(count, np.int64, (), args=(2,)).repeat(3)) == [0, 1] * 3
    pairs = Dataset.from_generator(
        lambda: ((np.int64(i), np.float32(i / 2)) for i in range(3)),
        output_types=(np.int64, np.float32),
        output_shapes=((), ()),
    )
    assert pairs.element_spec == (
        sluice.data.TensorSpec((), "int64"),
        sluice.data.TensorSpec((), "float32"),
    )
    assert [(int(a), float(b)) for a, b in pairs] == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_from_generator_checks_its_arguments_as_tf_data():
    with pytest.raises(TypeError, match="`generator` must be a Python callable."):
        Dataset.from_generator(5, output_types=np.int64)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="either the `output_signature` argument or the"):
        Dataset.from_generator(lambda: [1])
    with pytest.raises(TypeError, match="can not be used together with the `output_signature`"):
        Dataset.from_generator(
            lambda: [1], output_types=np.int64, output_signature=sluice.data.TensorSpec((), "int64")
        )


def test_from_generator_through_the_service_runs_on_the_workers_in_parallel_epochs_only(
    two_workers,
):
    def count():
        yield from range(2000)

    ds = Dataset.from_generator(count, output_signature=sluice.data.TensorSpec((), "int64"))
    got = ints(ds.apply(sluice.distribute("parallel_epochs", two_workers)))
    assert sorted(got) == sorted(list(range(2000)) * 2)
    for mode in ("distributed_epoch", sluice.ShardingPolicy.DATA, sluice.ShardingPolicy.FILE):
        with pytest.raises(InvalidArgumentError, match="from_generator .*count.* cannot be split"):
            list(ds.apply(sluice.distribute(mode, two_workers)))


def test_group_by_window_with_a_native_reduce_and_a_python_one():
    ds = Dataset.range(10).group_by_window(
        lambda x: x % 3, lambda key, window: window.batch(2), window_size=2
    )
    assert "group_by_window(" in repr(ds) and "reduce=element_window().batch(2)" in repr(ds)
    # Windows as they fill; then the groups left, smallest key first.
    assert [b.tolist() for b in ds] == [[0, 3], [1, 4], [2, 5], [6, 9], [7], [8]]
    # A reduce that uses the key runs in Python, on a dataset of the window.
    keyed = Dataset.range(6).group_by_window(
        lambda x: x % 2,
        lambda key, window: window.map(lambda x: x * 10 + key),
        window_size_func=lambda key: 3,
    )
    assert ints(keyed) == [0, 20, 40, 11, 31, 51]
    by_name = Dataset.from_tensor_slices([3, 1, 3, 1]).group_by_window(
        "identity", lambda k, w: w.batch(2), window_size=2
    )
    assert [b.tolist() for b in by_name] == [[3, 3], [1, 1]]


def test_group_by_window_checks_as_tf_data():
    ds = Dataset.range(4)
    reduce = lambda k, w: w.batch(2)  # noqa: E731
    with pytest.raises(ValueError, match="Either the `window_size` argument or the"):
        ds.group_by_window(lambda x: x, reduce)
    with pytest.raises(ValueError, match="Either the `window_size` argument or the"):
        ds.group_by_window(lambda x: x, reduce, window_size=2, window_size_func=lambda k: 2)
    with pytest.raises(InvalidArgumentError, match="Window size must be greater than zero"):
        ds.group_by_window(lambda x: x, reduce, window_size=0)
    with pytest.raises(sluice.errors.OpError, match="must return a single tf.int64 scalar"):
        list(ds.group_by_window(lambda x: 1.5, reduce, window_size=2))
    with pytest.raises(sluice.errors.OpError, match="Window size must be greater than zero"):
        list(ds.group_by_window(lambda x: x, reduce, window_size_func=lambda k: np.int64(0)))


def test_bucket_by_sequence_length_pads_each_bucket_batch():
    lengths = [1, 5, 2, 6, 3, 7, 1]
    seqs = Dataset.from_generator(
        lambda: (np.arange(1, n + 1) for n in lengths),
        output_signature=sluice.data.TensorSpec((None,), "int64"),
    )
    ds = seqs.bucket_by_sequence_length(len, [4], [2, 2])
    got = [b.tolist() for b in ds]
    assert got == [
        [[1, 0], [1, 2]],
        [[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 6]],
        [[1, 2, 3], [1, 0, 0]],
        [[1, 2, 3, 4, 5, 6, 7]],
    ]
    dropped = seqs.bucket_by_sequence_length(len, [4], [2, 2], drop_remainder=True)
    assert len(list(dropped)) == 3
    to_boundary = seqs.bucket_by_sequence_length(
        len, [4, 10], [2, 2, 2], pad_to_bucket_boundary=True, padding_values=np.int64(-1)
    )
    first = list(to_boundary)[0]
    assert first.tolist() == [[1, -1, -1], [1, 2, -1]]
    same = Dataset.from_tensor_slices(np.ones((4, 3), np.int64)).bucket_by_sequence_length(
        len, [2], [1, 2], no_padding=True
    )
    assert [b.shape for b in same] == [(2, 3), (2, 3)]
    with pytest.raises(ValueError, match="must equal `len\\(bucket_boundaries\\) \\+ 1`"):
        seqs.bucket_by_sequence_length(len, [4], [2])


def test_group_by_window_and_bucketing_on_the_workers(two_workers):
    ds = Dataset.range(20).group_by_window(
        lambda x: x % 4, lambda key, window: window.batch(5), window_size=5
    )
    got = [b.tolist() for b in ds.apply(sluice.distribute("parallel_epochs", two_workers))]
    assert sorted(got) == sorted([[k + 4 * i for i in range(5)] for k in range(4)] * 2)
    seqs = Dataset.from_tensor_slices(np.arange(1, 9)).map(lambda n: np.arange(int(n)))
    buckets = seqs.bucket_by_sequence_length(len, [5], [4, 4])
    got = [b.shape for b in buckets.apply(sluice.distribute("parallel_epochs", two_workers))]
    assert sorted(got) == sorted([(4, 4), (4, 8)] * 2)


def test_a_parallel_interleave_keeps_exactly_once_delivery_when_a_worker_stops(tmp_path):
    from conftest import start_cluster, stop_cluster

    paths = write_records(tmp_path, 8, 500)
    every = sorted(f"{f}:{i}".encode() for f in range(len(paths)) for i in range(500))
    # A short worker timeout, so the stopped worker's task moves soon.
    cluster = start_cluster(2, worker_timeout_ms=1000, data_roots=[str(tmp_path)])
    try:
        files = Dataset.from_tensor_slices(paths)
        ds = files.interleave(
            TFRecordDataset, cycle_length=3, block_length=2, num_parallel_calls=AUTOTUNE
        ).apply(sluice.distribute("distributed_epoch", cluster.target, max_outstanding_requests=4))
        it = iter(ds)
        seen = [next(it) for _ in range(700)]
        # Both workers hold records leased and not yet read; the task that takes the stopped
        # worker's stream over reads its files again in the same order and skips what was read.
        cluster.workers[0].stop()
        seen.extend(it)
        assert sorted(seen) == every
    finally:
        stop_cluster(cluster)
