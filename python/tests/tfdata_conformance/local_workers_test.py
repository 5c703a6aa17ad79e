# Copyright 2021 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# Ported to Sluice and modified: tensorflow/python/data/experimental/kernel_tests/service/
# local_workers_test.py, against Sluice's Python API (local workers run in this process, remote
# ones in a helper process; reads with deadlines; eager/graph modes are not parameters).
"""Ports of tf.data service's local worker tests (``LocalWorkersTest``,
``LocalTaskGarbageCollectTest``)."""

from __future__ import annotations

import multiprocessing

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset
from tfdata_conformance._cluster import (
    MultiProcessCluster,
    Next,
    assert_count_equal,
    assert_dataset_produces,
    bug,
    get_dataset_output,
    make_distributed_dataset,
    make_distributed_range_dataset,
    not_applicable,
    py,
)

ShardingPolicy = sluice.ShardingPolicy

_WORKER_COUNTS = pytest.mark.parametrize(
    "num_local_workers,num_remote_workers", [(1, 0), (1, 3), (3, 0), (3, 3)]
)


def testOneLocalWorker():
    """Ports LocalWorkersTest.testOneLocalWorker."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=5)
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, target_workers="local")
    assert_dataset_produces(ds, list(range(num_elements)))


@_WORKER_COUNTS
def testLocalWorkers(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testLocalWorkers."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, target_workers="LOCAL")
    assert_dataset_produces(
        ds, num_local_workers * list(range(num_elements)), assert_items_equal=True
    )


@_WORKER_COUNTS
def testRepeatedDataset(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testRepeatedDataset."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    num_repetitions = 5
    ds = make_distributed_range_dataset(num_elements, cluster, target_workers="LOCAL")
    ds = ds.repeat(num_repetitions)
    assert_dataset_produces(
        ds,
        num_local_workers * num_repetitions * list(range(num_elements)),
        assert_items_equal=True,
    )


@_WORKER_COUNTS
def testPrefetchingDataset(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testPrefetchingDataset."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, target_workers="LOCAL")
    ds = ds.prefetch(10)
    assert_dataset_produces(
        ds, num_local_workers * list(range(num_elements)), assert_items_equal=True
    )


@_WORKER_COUNTS
def testMultipleEpochs(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testMultipleEpochs."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, target_workers="LOCAL")
    for _ in range(10):
        assert_dataset_produces(
            ds, num_local_workers * list(range(num_elements)), assert_items_equal=True
        )


@_WORKER_COUNTS
def testDynamicSharding(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testDynamicSharding."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 100
    ds = make_distributed_range_dataset(
        num_elements, cluster, processing_mode=ShardingPolicy.DYNAMIC, target_workers="LOCAL"
    )
    assert_dataset_produces(ds, list(range(num_elements)), assert_items_equal=True)


def testMultipleConsumers():
    """Ports LocalWorkersTest.testMultipleConsumers."""
    num_local_workers, num_remote_workers = 1, 3
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    # Elements are prefetched one per core: tf.data sizes the dataset by the core count.
    num_elements = 50 + (multiprocessing.cpu_count() * 2)
    num_consumers = 8
    iterators = []
    for _ in range(num_consumers):
        dataset = make_distributed_range_dataset(num_elements, cluster, job_name="shared_job")
        iterators.append(Next(dataset))
    results = []
    for _ in range(10):
        for it in iterators:
            results.append(it())
    for it in iterators:
        results.extend(it.rest())
    assert_count_equal(
        results, (num_local_workers + num_remote_workers) * list(range(num_elements))
    )


@_WORKER_COUNTS
def testEmptyDataset(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testEmptyDataset."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    ds = make_distributed_range_dataset(0, cluster, target_workers="LOCAL")
    assert_dataset_produces(ds, [])


@pytest.mark.parametrize("num_local_workers,num_remote_workers", [(0, 1), (0, 3), (3, 1), (3, 3)])
def testNonLocalRead(num_local_workers, num_remote_workers):
    """Ports LocalWorkersTest.testNonLocalRead: the remote workers run and produce data."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=num_remote_workers
    )
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster)
    num_workers = num_local_workers + num_remote_workers
    assert_dataset_produces(ds, num_workers * list(range(num_elements)), assert_items_equal=True)


def testNoLocalWorker():
    """Ports LocalWorkersTest.testNoLocalWorker."""
    cluster = MultiProcessCluster(num_local_workers=0, num_remote_workers=3)
    ds = make_distributed_range_dataset(10, cluster, target_workers="LOCAL")
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Local reads require local tf.data workers, but no local worker is found.",
    ):
        get_dataset_output(ds)


def testInconsistentTargetWorkers():
    """Ports LocalWorkersTest.testInconsistentTargetWorkers."""
    cluster = MultiProcessCluster(num_local_workers=3, num_remote_workers=3)
    ds = Dataset.range(10)
    datasets = [
        make_distributed_dataset(ds, cluster, job_name="test_job", target_workers=target_workers)
        for target_workers in ["AUTO", "ANY", "LOCAL"]
    ]
    with pytest.raises(
        errors.InvalidArgumentError,
        match="but found an existing job with different parameters: "
        "Existing target workers: <AUTO>",
    ):
        for dataset in datasets:
            get_dataset_output(dataset)


def testAnonymousJobWithDifferentTargetWorkers():
    """Ports LocalWorkersTest.testAnonymousJobWithDifferentTargetWorkers."""
    num_local_workers, num_remote_workers = (3, 3)
    cluster = MultiProcessCluster(num_local_workers, num_remote_workers)
    num_elements = 10
    ds = Dataset.range(num_elements)
    datasets = {
        target_workers: make_distributed_dataset(ds, cluster, target_workers=target_workers)
        for target_workers in ["AUTO", "ANY", "LOCAL"]
    }
    num_workers = num_local_workers + num_remote_workers
    assert_dataset_produces(
        datasets["AUTO"], num_workers * list(range(num_elements)), assert_items_equal=True
    )
    assert_dataset_produces(
        datasets["ANY"], num_workers * list(range(num_elements)), assert_items_equal=True
    )
    assert_dataset_produces(
        datasets["LOCAL"], num_local_workers * list(range(num_elements)), assert_items_equal=True
    )


def testCoordinatedRead():
    """Ports LocalWorkersTest.testCoordinatedRead."""
    cluster = MultiProcessCluster(num_local_workers=3, num_remote_workers=3)
    ds = Dataset.range(10).repeat()
    ds = make_distributed_dataset(
        ds, cluster, job_name="test_job", consumer_index=0, num_consumers=3, target_workers="LOCAL"
    )
    with pytest.raises(
        errors.InvalidArgumentError, match="Coordinated reads require non-local workers"
    ):
        get_dataset_output(ds)


# LocalTaskGarbageCollectTest: each epoch's iterator replaces the previous one, whose local
# tasks are deleted.


def _make_distributed_infinite_range_dataset(cluster, job_name=None):
    dataset = Dataset.range(1000000).repeat()
    return make_distributed_dataset(
        dataset,
        cluster=cluster,
        job_name=job_name,
        processing_mode=ShardingPolicy.OFF,
        target_workers="LOCAL",
    )


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testGcMultipleEpochs(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testMultipleEpochs."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    num_epochs, num_steps = 5, 5
    dataset = _make_distributed_infinite_range_dataset(cluster)
    get_next = None
    for _ in range(num_epochs):
        # The previous epoch's iterator is collected.
        previous, get_next = get_next, Next(dataset)
        if previous is not None:
            previous.release()
        for i in range(num_steps):
            assert py(get_next()) == i


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testMultipleEpochsSharedJob(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testMultipleEpochsSharedJob."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    num_epochs, num_steps = 5, 5
    dataset = _make_distributed_infinite_range_dataset(cluster, job_name="shared_job_name")
    get_next = None
    for _ in range(num_epochs):
        # The previous epoch's iterator is collected.
        previous, get_next = get_next, Next(dataset)
        if previous is not None:
            previous.release()
        for i in range(num_steps):
            assert py(get_next()) == i


@pytest.mark.parametrize("job_name", [None, "shared_job_name"])
@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testRepeatDistributedDataset(num_remote_workers, job_name):
    """Ports LocalTaskGarbageCollectTest.testRepeatDistributedDataset."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    dataset = make_distributed_range_dataset(10, cluster, job_name=job_name, target_workers="LOCAL")
    dataset = dataset.repeat(3)
    assert_dataset_produces(dataset, list(range(10)) * 3)


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testReadFromDeletedTask(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testReadFromDeletedTask."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    num_steps = 10
    dataset = _make_distributed_infinite_range_dataset(cluster, job_name="shared_job_name")
    get_next = Next(dataset)
    for i in range(num_steps):
        assert py(get_next()) == i
    # A new dataset object starts at the same iteration, whose task has been deleted.
    dataset = _make_distributed_infinite_range_dataset(cluster, job_name="shared_job_name")
    previous, get_next = get_next, Next(dataset)
    previous.release()  # tf.data's rebinding of get_next deletes the first iterator
    with pytest.raises(errors.FailedPreconditionError, match="which has been deleted."):
        get_next()


@not_applicable("graph mode: tf.compat.v1 sessions")
@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testReadFromDeletedTask_GraphMode(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testReadFromDeletedTask_GraphMode."""


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testMultipleEpochs_WorkerRestart(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testMultipleEpochs_WorkerRestart."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    num_steps = 10
    dataset = _make_distributed_infinite_range_dataset(cluster, job_name="shared_job_name")
    get_next = Next(dataset)
    for i in range(num_steps):
        assert py(get_next()) == i
    # The worker makes the task again after the iterator is deleted and the worker restarts.
    get_next.release()
    cluster.restart_local_workers()
    get_next = Next(dataset)
    for i in range(num_steps):
        assert py(get_next()) == i


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testMultipleEpochs_DispatcherRestart(num_remote_workers):
    """Ports LocalTaskGarbageCollectTest.testMultipleEpochs_DispatcherRestart."""
    cluster = MultiProcessCluster(num_local_workers=1, num_remote_workers=num_remote_workers)
    num_steps = 10
    dataset = _make_distributed_infinite_range_dataset(cluster, job_name="shared_job_name")
    get_next = Next(dataset)
    for i in range(num_steps):
        assert py(get_next()) == i
    # The worker makes the task again after the iterator is deleted and the dispatcher restarts.
    get_next.release()
    cluster.restart_dispatcher()
    get_next = Next(dataset)
    for i in range(num_steps):
        assert py(get_next()) == i
