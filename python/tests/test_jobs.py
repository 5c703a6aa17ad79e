"""Named jobs, registration by id, and element specs."""

from __future__ import annotations

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TensorSpec


def ints(dataset) -> list:
    return sorted(int(x) for x in dataset)


def test_consumers_sharing_a_job_name_split_one_epoch(cluster):
    def reader():
        return Dataset.range(20).apply(
            sluice.distribute("distributed_epoch", cluster.target, job_name="shared")
        )

    a, b = iter(reader()), iter(reader())
    seen = []
    for it in (a, b):
        seen.extend(int(x) for x in it)
    assert sorted(seen) == list(range(20))


def test_a_finished_named_job_reused_gives_an_empty_epoch_then_a_new_one(cluster):
    first = Dataset.range(10).apply(
        sluice.distribute("parallel_epochs", cluster.target, job_name="multi")
    )
    assert ints(first) == sorted(list(range(10)) * 2)
    late = Dataset.range(10).apply(
        sluice.distribute("parallel_epochs", cluster.target, job_name="multi")
    )
    assert ints(late) == []  # repetition 0 already finished
    assert ints(late) == sorted(list(range(10)) * 2)  # repetition 1 is a new iteration


def test_register_dataset_and_from_dataset_id_with_element_spec(cluster):
    dataset = Dataset.range(6).map("square").batch(4)
    dataset_id = sluice.register_dataset(cluster.target, dataset, dataset_id="squares")
    assert dataset_id == "squares"
    # The same dataset under the same id returns the id again.
    assert sluice.register_dataset(cluster.target, dataset, dataset_id="squares") == "squares"
    spec = TensorSpec((None,), "int64")
    ds = sluice.from_dataset_id("distributed_epoch", cluster.target, dataset_id, element_spec=spec)
    assert ds.element_spec == spec
    # As tf.data: how many workers contribute is not known up front.
    assert ds.cardinality() == -2
    batches = sorted((b.tolist() for b in ds), key=len, reverse=True)
    assert batches == [[0, 1, 4, 9], [16, 25]]


def test_from_dataset_id_refuses_a_wrong_element_spec(cluster):
    dataset_id = sluice.register_dataset(cluster.target, Dataset.range(3))
    with pytest.raises(sluice.errors.InvalidArgumentError, match="does not match"):
        sluice.from_dataset_id(
            "parallel_epochs",
            cluster.target,
            dataset_id,
            element_spec=TensorSpec((), "float32"),
        )


def test_from_dataset_id_readers_share_a_named_job(cluster):
    dataset_id = sluice.register_dataset(cluster.target, Dataset.range(12), compression=None)
    readers = [
        sluice.from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="j")
        for _ in range(2)
    ]
    iterators = [iter(r) for r in readers]
    seen = [int(x) for it in iterators for x in it]
    assert sorted(seen) == list(range(12))


def test_element_specs_of_tuples_and_batches(cluster):
    ds = Dataset.range(5).enumerate().batch(2, drop_remainder=True)
    assert ds.element_spec == (TensorSpec((2,), "int64"), TensorSpec((2,), "int64"))
    service = ds.apply(sluice.distribute("parallel_epochs", cluster.target))
    assert service.element_spec == ds.element_spec
    assert repr(TensorSpec((None, 3), "float32")) == "TensorSpec(shape=(None, 3), dtype=float32)"


def test_cross_trainer_cache_repr_and_validation():
    assert repr(sluice.CrossTrainerCache("t")) == "CrossTrainerCache(trainer_id='t')"
    # Refused where it is made, as tf.data refuses it (a ValueError).
    for trainer_id in ("", None):
        with pytest.raises(ValueError) as e:
            sluice.CrossTrainerCache(trainer_id)  # type: ignore[arg-type]
        assert isinstance(e.value, sluice.errors.InvalidArgumentError)
        assert str(e.value) == "tf.data service cross-trainer cache requires a non-empty trainer ID."


def test_a_service_datasets_cardinality_is_tf_datas(cluster):
    """What an epoch read through the service yields, as tf.data reports it: unknown for a
    finite dataset (parallel epochs over two workers yield it twice), infinite where every
    worker runs an infinite one, and infinite for a coordinated read."""
    read = lambda ds, mode, **kw: ds.apply(sluice.distribute(mode, cluster.target, **kw))
    assert read(Dataset.range(10), "parallel_epochs").cardinality() == -2
    assert read(Dataset.range(10), "distributed_epoch").cardinality() == -2
    assert read(Dataset.range(10).filter("is_even"), "parallel_epochs").cardinality() == -2
    assert read(Dataset.range(0), "parallel_epochs").cardinality() == 0
    assert read(Dataset.range(10).repeat(), "parallel_epochs").cardinality() == -1
    assert read(Dataset.range(10).repeat(), "distributed_epoch").cardinality() == -1
    coordinated = read(
        Dataset.range(10).repeat(),
        "parallel_epochs",
        job_name="rounds",
        consumer_index=0,
        num_consumers=1,
    )
    assert coordinated.cardinality() == -1


def test_a_shared_cache_job_refuses_a_reader_with_another_compression(cluster):  # type: ignore[no-untyped-def]
    """The second trainer of a cross-trainer-cache job asks for uncompressed elements: refused
    when it asks for the job, naming both compressions, as tf.data refuses it (a data type
    mismatch)."""

    def reader(trainer: str, compression: object) -> sluice.data.Dataset:
        return (
            Dataset.range(10)
            .repeat()
            .apply(
                sluice.distribute(
                    "parallel_epochs",
                    cluster.target,
                    job_name="job",
                    compression=compression,
                    cross_trainer_cache=sluice.CrossTrainerCache(trainer),
                )
            )
        )

    first = iter(reader("Trainer 1", "AUTO"))
    assert next(first) is not None
    with pytest.raises(errors.InvalidArgumentError, match="Data type mismatch") as e:
        next(iter(reader("Trainer 2", None)))
    assert "Existing compression: <auto>; got <none>" in str(e.value)


def test_a_worker_added_mid_epoch_gets_its_task_while_the_reader_is_halfway(cluster):  # type: ignore[no-untyped-def]
    """A reader halfway through a parallel_epochs epoch has not drained the first worker's
    task into its buffer, so a worker that joins then still finds the epoch unfinished, gets a
    task, and the reader reads the dataset from both workers (as tf.data's reader, which
    prefetches about one element per core)."""
    import multiprocessing

    from conftest import start_cluster, stop_cluster

    c = start_cluster(1)
    try:
        num_elements = 2 * multiprocessing.cpu_count() + 100
        ds = Dataset.range(num_elements).apply(sluice.distribute("parallel_epochs", c.target))
        it = iter(ds)
        results = [int(next(it)) for _ in range(num_elements // 2)]
        c.workers.append(sluice.WorkerServer(sluice.WorkerConfig(c.target)))
        results += [int(x) for x in it]
        assert sorted(results) == sorted(2 * list(range(num_elements)))
    finally:
        stop_cluster(c)


def test_consumers_of_a_shared_job_each_get_their_share(tmp_path):  # type: ignore[no-untyped-def]
    """Eight readers of one named job take turns: none finds the epoch drained by the others'
    read-ahead, and together they read every worker's elements once."""
    import multiprocessing

    from conftest import start_cluster, stop_cluster

    c = start_cluster(4)
    try:
        num_elements = 50 + 2 * multiprocessing.cpu_count()
        iterators = [
            iter(
                Dataset.range(num_elements).apply(
                    sluice.distribute("parallel_epochs", c.target, job_name="shared_job")
                )
            )
            for _ in range(8)
        ]
        results = []
        for _ in range(10):
            for it in iterators:
                results.append(int(next(it)))
        for it in iterators:
            results.extend(int(x) for x in it)
        assert sorted(results) == sorted(4 * list(range(num_elements)))
    finally:
        stop_cluster(c)
