"""A worker's limits from Python: the memory budget fails the task that would exceed it (the
worker keeps serving), and a worker on every interface registers under ``worker_address``."""

from __future__ import annotations

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset


def test_a_batch_past_the_memory_budget_fails_and_the_worker_keeps_serving():
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(dispatcher.target, memory_budget_bytes=1 << 20)
        with sluice.WorkerServer(config):
            huge = Dataset.range(10**12).batch(10**12)
            ds = huge.apply(sluice.distribute("parallel_epochs", dispatcher.target))
            with pytest.raises(errors.OpError) as e:
                list(ds)
            # Alone on the worker, a task may hold the budget less its reserve (an eighth).
            assert "batch of task " in str(e.value)
            assert "needs 72 more bytes" in str(e.value)
            assert "(917504: the budget less 131072 kept in reserve" in str(e.value)
            assert "raise --memory-budget" in str(e.value)
            ds = Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            assert sorted(int(x) for x in ds) == [0, 1, 2]


def test_without_a_reserve_a_task_alone_may_fill_the_whole_budget():
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(
            dispatcher.target, memory_budget_bytes=1 << 20, memory_reserve_bytes=0
        )
        with sluice.WorkerServer(config):
            huge = Dataset.range(10**12).batch(10**12)
            ds = huge.apply(sluice.distribute("parallel_epochs", dispatcher.target))
            with pytest.raises(errors.OpError) as e:
                list(ds)
            assert "more than the memory budget of 1048576 bytes has left" in str(e.value)


def test_a_reserve_as_large_as_the_budget_is_refused():
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(
            dispatcher.target, memory_budget_bytes=1 << 20, memory_reserve_bytes=1 << 20
        )
        with pytest.raises(errors.InvalidArgumentError) as e:
            sluice.WorkerServer(config)
        assert "--memory-reserve" in str(e.value)


def test_a_worker_on_every_interface_needs_a_worker_address(no_credentials_in_env):
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(dispatcher.target, host="0.0.0.0", insecure=True)
        with pytest.raises(errors.InvalidArgumentError) as e:
            sluice.WorkerServer(config)
        assert "--advertise-address" in str(e.value)
        assert "worker_address" in str(e.value)


def test_a_pipeline_past_the_dispatchers_op_limit_is_refused_naming_it():
    config = sluice.DispatcherConfig(max_pipeline_ops=10)
    with sluice.DispatchServer(config) as dispatcher:
        with sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target)):
            ten = Dataset.range(100)
            for _ in range(10):
                ten = ten.skip(0)
            ds = ten.apply(sluice.distribute("parallel_epochs", dispatcher.target))
            assert sorted(int(x) for x in ds) == list(range(100))
            with pytest.raises(errors.InvalidArgumentError) as e:
                ten.skip(0).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            assert str(e.value) == (
                "the dataset definition has 11 ops, more than the limit of 10 "
                "(--max-pipeline-ops)"
            )


def test_a_worker_checks_its_own_op_limit_before_it_builds_a_task():
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(dispatcher.target, max_pipeline_ops=2)
        with sluice.WorkerServer(config):
            ds = Dataset.range(3).skip(0).skip(0).skip(0)
            with pytest.raises(errors.OpError) as e:
                list(ds.apply(sluice.distribute("parallel_epochs", dispatcher.target)))
            assert "the dataset definition has 3 ops, more than the limit of 2" in str(e.value)
