"""The seed's examples through the Python API, with their exact outputs."""

from __future__ import annotations

import sluice
from sluice.data import Dataset


def ints(dataset: Dataset) -> list:
    return sorted(int(x) for x in dataset)


def test_parallel_epochs_gives_every_element_once_per_worker(cluster):
    ds = Dataset.range(10).apply(sluice.distribute("parallel_epochs", cluster.target))
    assert ints(ds) == sorted(list(range(10)) * 2)


def test_distributed_epoch_gives_every_element_once(cluster):
    ds = Dataset.range(10).apply(sluice.distribute("distributed_epoch", cluster.target))
    assert ints(ds) == list(range(10))


def test_sharding_policy_enum_is_the_processing_mode(cluster):
    off = Dataset.range(4).apply(sluice.distribute(sluice.ShardingPolicy.OFF, cluster.target))
    dyn = Dataset.range(4).apply(sluice.distribute(sluice.ShardingPolicy.DYNAMIC, cluster.target))
    assert ints(off) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ints(dyn) == [0, 1, 2, 3]


def test_a_map_before_distribute_runs_on_the_workers_and_one_after_it_in_the_reader(cluster):
    ds = (
        Dataset.range(5)
        .map("square")
        .apply(sluice.distribute("distributed_epoch", cluster.target))
        .map("add_one")
    )
    assert ints(ds) == [1, 2, 5, 10, 17]
    # The workers run the registered definition; the reader runs the op after distribute.
    assert (
        repr(ds)
        == '<Dataset range(5).map(square).distribute(DYNAMIC, dataset_id="1000").map(add_one)>'
    )


def test_every_iteration_is_a_new_epoch(cluster):
    ds = Dataset.range(6).apply(sluice.distribute("distributed_epoch", cluster.target))
    assert ints(ds) == list(range(6))
    assert ints(ds) == list(range(6))


def test_service_accepts_the_cli_address_forms(cluster):
    address = cluster.dispatcher._address
    for service in [address, f"grpc://{address}", ("grpc", address), f"{address},{address}"]:
        ds = Dataset.range(3).apply(sluice.distribute("distributed_epoch", service))
        assert ints(ds) == [0, 1, 2], service


def test_servers_have_targets_reprs_and_context_managers():
    with sluice.DispatchServer() as dispatcher:
        assert dispatcher.target.startswith("grpc://127.0.0.1:")
        assert repr(dispatcher) == f"DispatchServer(node_id=1, {dispatcher.target})"
        with sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target)) as worker:
            assert worker.address.startswith("127.0.0.1:")
            assert worker.address in repr(worker)
            ds = Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            assert ints(ds) == [0, 1, 2]
    # join() returns at once after stop().
    dispatcher.join()
    worker.join()


def test_a_server_started_later(tmp_path):
    config = sluice.DispatcherConfig(work_dir=str(tmp_path / "journal"))
    dispatcher = sluice.DispatchServer(config, start=False)
    assert "not started" in repr(dispatcher)
    dispatcher.start()
    try:
        assert (tmp_path / "journal").is_dir()
        worker = sluice.WorkerServer(
            sluice.WorkerConfig(dispatcher.target, worker_tags=["COLOCATED"]), start=False
        )
        worker.start()
        ds = Dataset.range(4).apply(
            sluice.distribute("distributed_epoch", dispatcher.target, target_workers="any")
        )
        assert ints(ds) == [0, 1, 2, 3]
        worker.stop()
    finally:
        dispatcher.stop()
