"""Datasets that hold other datasets: ``from_tensors``, ``zip``, ``concatenate``,
``sample_from_datasets`` and ``choose_from_datasets``, locally and through a dispatcher with two
workers in parallel_epochs and distributed_epoch mode (where, as in tf.data, every splittable
source of the definition hands out its own splits)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import sluice
from sluice.data import Dataset, TensorSpec
from sluice.errors import InvalidArgumentError


def ints(ds):
    return [int(x) for x in ds]


def pairs(ds):
    return [(int(a), int(b)) for a, b in ds]


# Local iteration.


def test_from_tensors_is_one_element_of_any_structure():
    assert [x.tolist() for x in Dataset.from_tensors([1, 2])] == [[1, 2]]
    ds = Dataset.from_tensors((7, {"b": "x", "a": np.float32(0.5)}))
    [(a, d)] = list(ds)
    assert int(a) == 7 and d == {"a": np.float32(0.5), "b": b"x"}
    assert ds.cardinality() == 1
    assert ds.element_spec == (
        TensorSpec((), "int64"),
        {"a": TensorSpec((), "float32"), "b": TensorSpec((), "string")},
    )
    assert ints(Dataset.from_tensors(3).repeat(3)) == [3, 3, 3]
    assert Dataset.from_tensors(3).repeat().cardinality() == -1


@pytest.mark.parametrize(
    "build, want",
    [
        (lambda a, b: Dataset.zip(a, b), [(0, 10), (1, 11), (2, 12)]),
        (lambda a, b: Dataset.zip((a, b)), [(0, 10), (1, 11), (2, 12)]),
        (lambda a, b: Dataset.zip(datasets=(a, b)), [(0, 10), (1, 11), (2, 12)]),
        # Ends with the shortest input, whichever it is.
        (lambda a, b: Dataset.zip(b, a.take(2)), [(10, 0), (11, 1)]),
    ],
)
def test_zip_forms(build, want):
    ds = build(Dataset.range(3), Dataset.range(10, 20))
    assert pairs(ds) == want
    assert ds.cardinality() == len(want)
    assert ds.element_spec == (TensorSpec((), "int64"), TensorSpec((), "int64"))


def test_zip_of_dicts_nested_structures_and_one_dataset():
    ds = Dataset.zip({"y": Dataset.range(2), "x": Dataset.range(5, 9)})
    assert [{k: int(v) for k, v in d.items()} for d in ds] == [
        {"x": 5, "y": 0},
        {"x": 6, "y": 1},
    ]
    nested = Dataset.zip((Dataset.range(2), (Dataset.range(3), Dataset.from_tensors(9).repeat())))
    assert [(int(a), (int(b), int(c))) for a, (b, c) in nested] == [(0, (0, 9)), (1, (1, 9))]
    assert ints(Dataset.zip(Dataset.range(3))) == [0, 1, 2]
    assert [tuple(int(v) for v in t) for t in Dataset.zip((Dataset.range(2),))] == [(0,), (1,)]
    assert Dataset.zip(Dataset.range(3).repeat(), Dataset.range(4)).cardinality() == 4


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda: Dataset.zip(), TypeError, "Must pass at least one dataset to `zip`."),
        (
            lambda: Dataset.zip(Dataset.range(1), datasets=(Dataset.range(1),)),
            TypeError,
            "Both `*args` and `datasets` cannot be set.",
        ),
        (
            lambda: Dataset.zip([Dataset.range(1), Dataset.range(2)]),
            TypeError,
            "Python `list` is not supported and you should use `tuple` instead.",
        ),
        (lambda: Dataset.zip((Dataset.range(1), 3)), TypeError, "got int"),
    ],
)
def test_zip_argument_errors(call, error, text):
    with pytest.raises(error, match=pytest.importorskip("re").escape(text)):
        call()


def test_concatenate_and_its_specs():
    ds = Dataset.range(3).concatenate(Dataset.range(10, 12))
    assert ints(ds) == [0, 1, 2, 10, 11]
    assert ds.cardinality() == 5
    assert ints(ds.repeat(2)) == [0, 1, 2, 10, 11] * 2
    shapes = Dataset.from_tensors([1, 2]).concatenate(Dataset.from_tensors([1, 2, 3]))
    assert shapes.element_spec == TensorSpec((None,), "int64")
    assert [x.tolist() for x in shapes] == [[1, 2], [1, 2, 3]]
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        Dataset.range(3).concatenate(Dataset.from_tensor_slices([0.5]))
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        Dataset.range(3).concatenate(Dataset.zip(Dataset.range(1), Dataset.range(1)))
    assert Dataset.range(3).concatenate(Dataset.range(2).repeat()).cardinality() == -1


def test_sample_from_datasets():
    a, b = Dataset.range(50), Dataset.range(100, 150)
    ds = Dataset.sample_from_datasets([a, b], seed=7)
    first = ints(ds)
    assert sorted(first) == list(range(50)) + list(range(100, 150))
    assert ints(ds) == first  # a seed fixes the draws
    assert first != sorted(first)  # both inputs are drawn from early on
    only_b = Dataset.sample_from_datasets([a, b], weights=[0.0, 1.0], seed=1)
    assert ints(only_b) == list(range(100, 150))
    stopped = Dataset.sample_from_datasets(
        [Dataset.range(3), Dataset.range(100, 200)], weights=[0.5, 0.5], seed=3,
        stop_on_empty_dataset=True,
    )
    got = ints(stopped)
    assert len([x for x in got if x < 3]) == 3 or len(got) == 103
    assert ds.cardinality() == -2
    assert Dataset.sample_from_datasets([a.repeat(), b]).cardinality() == -1


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda: Dataset.sample_from_datasets([]), ValueError,
         "Invalid `datasets`. `datasets` should not be empty."),
        (lambda: Dataset.sample_from_datasets([Dataset.range(1)], weights=[0.5, 0.5]), ValueError,
         "Invalid `weights`. `weights` should have the same length as `datasets` but got "
         "`len(weights)=2` vs. `len(datasets)=1`."),
        (lambda: Dataset.sample_from_datasets(Dataset.range(1)), TypeError,
         "Invalid `datasets`. `datasets` should be a list of `tf.data.Dataset`s"),
        (lambda: Dataset.sample_from_datasets([Dataset.range(1), Dataset.from_tensors("a")]),
         TypeError, "compatible structures"),
        (lambda: Dataset.sample_from_datasets([Dataset.range(1)], weights=[-1.0]),
         InvalidArgumentError, "Every weight must be finite and not negative"),
        (lambda: Dataset.choose_from_datasets([], Dataset.range(1)), ValueError,
         "Invalid `datasets`. `datasets` should not be empty."),
        (lambda: Dataset.choose_from_datasets([Dataset.range(1)], [0]), TypeError,
         "Invalid `choice_dataset`. `choice_dataset` should be a `tf.data.Dataset`"),
        (lambda: Dataset.choose_from_datasets(
            [Dataset.range(1)], Dataset.from_tensor_slices(np.array([0], dtype=np.int32))),
         TypeError,
         "Invalid `choice_dataset`. Elements of `choice_dataset` must be scalar of type `tf.int64`."),
        (lambda: Dataset.choose_from_datasets(
            [Dataset.range(1)], Dataset.from_tensors([0, 1])),
         TypeError, "must be scalar of type `tf.int64`"),
    ],
)
def test_sample_and_choose_argument_errors(call, error, text):
    import re

    with pytest.raises(error, match=re.escape(text)):
        call()


def test_choose_from_datasets():
    letters = [Dataset.from_tensors(c).repeat() for c in (b"a", b"b", b"c")]
    ds = Dataset.choose_from_datasets(letters, Dataset.range(3).repeat(2))
    assert list(ds) == [b"a", b"b", b"c", b"a", b"b", b"c"]
    short = [Dataset.range(1), Dataset.range(10, 13)]
    choice = Dataset.from_tensor_slices(np.array([0, 0, 1, 1], dtype=np.int64))
    assert ints(Dataset.choose_from_datasets(short, choice)) == [0]  # stops on the empty one
    assert ints(Dataset.choose_from_datasets(short, choice, stop_on_empty_dataset=False)) == [
        0, 10, 11,
    ]
    bad = Dataset.choose_from_datasets(short, Dataset.from_tensors(np.int64(5)))
    with pytest.raises(InvalidArgumentError, match="selected input 5, out of range for 2"):
        list(bad)


def test_python_functions_inside_nested_datasets_run():
    ds = Dataset.zip(Dataset.range(3).map(lambda x: x * 10), Dataset.range(3).filter(lambda x: x > 0))
    assert pairs(ds) == [(0, 1), (10, 2)]
    joined = Dataset.range(2).concatenate(Dataset.range(2).map(lambda x: x + 100))
    assert ints(joined) == [0, 1, 100, 101]


# Through the service.


def read(ds, mode, cluster, **kwargs):
    return list(ds.apply(sluice.distribute(mode, cluster.target, **kwargs)))


def test_parallel_epochs_runs_every_form_on_every_worker(cluster):
    cases = [
        (Dataset.zip(Dataset.range(5), Dataset.from_tensors(7).repeat()), pairs,
         [(i, 7) for i in range(5)]),
        (Dataset.range(3).concatenate(Dataset.range(10, 12)), ints, [0, 1, 2, 10, 11]),
        (Dataset.zip(Dataset.range(4), Dataset.range(10, 14)).map(lambda a, b: a + b), ints,
         [10, 12, 14, 16]),
        (Dataset.sample_from_datasets([Dataset.range(5), Dataset.range(10, 15)], seed=2), ints,
         list(range(5)) + list(range(10, 15))),
        (Dataset.choose_from_datasets([Dataset.range(3), Dataset.range(10, 13)],
                                      Dataset.range(2).repeat(3)), ints, [0, 10, 1, 11, 2, 12]),
    ]
    for ds, convert, want in cases:
        got = convert(read(ds, "parallel_epochs", cluster))
        # Every worker runs the whole dataset.
        assert Counter(got) == Counter(want * 2), ds


def test_distributed_epoch_gives_every_source_its_own_split_provider(cluster):
    # A from_tensors input repeated has one split per repetition: the workers share its
    # repetitions, and each worker's repeat goes on to the next one, so every range split is
    # paired once.
    zipped = Dataset.zip(Dataset.range(20), Dataset.from_tensors(7).repeat())
    assert sorted(pairs(read(zipped, "distributed_epoch", cluster))) == [(i, 7) for i in range(20)]
    nested = Dataset.zip(
        (Dataset.from_tensors(1).repeat(), (Dataset.range(10).map("square"), Dataset.from_tensors(2).repeat()))
    )
    got = sorted((int(a), int(b), int(c)) for a, (b, c) in read(nested, "distributed_epoch", cluster))
    assert got == [(1, i * i, 2) for i in range(10)]
    # Each choice is made once, by one worker.
    words = [b"foo", b"bar", b"baz"]
    choices = np.random.default_rng(5).integers(3, size=(15,), dtype=np.int64)
    chosen = Dataset.choose_from_datasets(
        [Dataset.from_tensors(w).repeat() for w in words], Dataset.from_tensor_slices(choices)
    )
    assert Counter(read(chosen, "distributed_epoch", cluster)) == Counter(
        words[i] for i in choices
    )
    # Each source's splits once: the from_tensors one too.
    joined = Dataset.range(10).concatenate(Dataset.from_tensors(99))
    assert Counter(ints(read(joined, "distributed_epoch", cluster))) == Counter(
        list(range(10)) + [99]
    )
    # Two ranges, each split between the workers: every element of each once.
    concatenated = Dataset.range(5).concatenate(Dataset.range(10, 15))
    assert sorted(ints(read(concatenated, "distributed_epoch", cluster))) == list(range(5)) + list(
        range(10, 15)
    )
    sampled = Dataset.sample_from_datasets([Dataset.range(4), Dataset.range(10, 14)], seed=1)
    assert sorted(ints(read(sampled, "distributed_epoch", cluster))) == [0, 1, 2, 3, 10, 11, 12, 13]
    # Zipped ranges: each worker pairs the splits it got of each, so every pair holds one
    # element of each range and none is read twice.
    both = read(Dataset.zip(Dataset.range(30), Dataset.range(100, 130)), "distributed_epoch", cluster)
    firsts, seconds = zip(*pairs(both)) if both else ((), ())
    assert len(set(firsts)) == len(firsts) and set(firsts) <= set(range(30))
    assert len(set(seconds)) == len(seconds) and set(seconds) <= set(range(100, 130))
    # Python functions inside nested datasets run on the workers.
    mapped = Dataset.zip(Dataset.range(10).map(lambda x: x * 2), Dataset.from_tensors(1).repeat())
    assert sorted(pairs(read(mapped, "distributed_epoch", cluster))) == [
        (2 * i, 1) for i in range(10)
    ]
    # A lone from_tensors is one split.
    assert ints(read(Dataset.from_tensors(5), "distributed_epoch", cluster)) == [5]


def test_distributed_epoch_refuses_a_random_source_anywhere(cluster):
    text = "Cannot create split providers for dataset of type RandomDataset"
    build = lambda: Dataset.zip(Dataset.range(3), Dataset.random(seed=1))  # noqa: E731
    with pytest.raises(InvalidArgumentError, match=text):
        build().apply(sluice.distribute("distributed_epoch", cluster.target))
    # Registered, it is refused when read by id in distributed_epoch mode.
    dataset_id = sluice.register_dataset(cluster.target, build())
    with pytest.raises(InvalidArgumentError, match=text):
        sluice.from_dataset_id("distributed_epoch", cluster.target, dataset_id)
    # parallel_epochs runs it.
    assert read(build().take(2), "parallel_epochs", cluster)


def test_static_sharding_shards_the_output_of_nested_datasets():
    from conftest import start_cluster, stop_cluster

    cluster = start_cluster(2, worker_addresses=["127.0.0.1:%port%", "127.0.0.1:%port%"])
    try:
        zipped = Dataset.zip(Dataset.range(10), Dataset.from_tensors(7).repeat())
        # DATA: each worker keeps every other element of the whole zip: together, each once.
        got = sorted(pairs(read(zipped, "data", cluster)))
        assert got == [(i, 7) for i in range(10)]
        # FILE_OR_DATA: a range is no files source, so DATA it is.
        joined = Dataset.range(5).concatenate(Dataset.range(10, 15))
        assert sorted(ints(read(joined, "file_or_data", cluster))) == list(range(5)) + list(
            range(10, 15)
        )
    finally:
        stop_cluster(cluster)
