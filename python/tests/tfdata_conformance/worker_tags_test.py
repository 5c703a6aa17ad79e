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
# worker_tags_test.py, against Sluice's Python API (local workers run in this process, remote
# ones in a helper process; reads with deadlines; eager/graph modes are not parameters).
"""Ports of tf.data service's worker tag tests (``WorkerTagsTest``): with ``target_workers``
``AUTO``, a reader skips ``COLOCATED`` workers in other processes."""

from __future__ import annotations

import multiprocessing

import pytest

import sluice
from tfdata_conformance._cluster import (
    COLOCATED,
    MultiProcessCluster,
    Next,
    assert_count_equal,
    assert_dataset_produces,
    bug,
    check_coordinated_read_groups,
    make_coordinated_read_dataset,
    make_distributed_range_dataset,
    wait_until,
)


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testReadFromLocalWorker(num_remote_workers):
    """Ports WorkerTagsTest.testReadFromLocalWorker."""
    cluster = MultiProcessCluster(
        num_local_workers=1, num_remote_workers=num_remote_workers, worker_tags=[COLOCATED]
    )
    num_elements = 100
    dataset = make_distributed_range_dataset(num_elements, cluster)
    # Only reads from the local worker.
    assert_dataset_produces(dataset, list(range(num_elements)))


@pytest.mark.parametrize("num_local_workers,num_remote_workers", [(1, 0), (1, 3), (3, 0), (3, 3)])
def testReadFromLocalAndNonTpuWorkers(num_local_workers, num_remote_workers):
    """Ports WorkerTagsTest.testReadFromLocalAndNonTpuWorkers."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers,
        num_remote_workers=num_remote_workers,
        worker_tags=[COLOCATED],
    )
    cluster.start_remote_worker(worker_tags=None)
    num_elements = 100
    dataset = make_distributed_range_dataset(num_elements, cluster)
    # Reads from the local workers and the untagged one.
    assert_dataset_produces(
        dataset, (num_local_workers + 1) * list(range(num_elements)), assert_items_equal=True
    )


@pytest.mark.parametrize("num_remote_workers", [0, 3])
def testLocalWorkerHasNoTag(num_remote_workers):
    """Ports WorkerTagsTest.testLocalWorkerHasNoTag."""
    cluster = MultiProcessCluster(
        num_local_workers=0, num_remote_workers=num_remote_workers, worker_tags=[COLOCATED]
    )
    cluster.start_local_worker(worker_tags=None)
    num_elements = 100
    dataset = make_distributed_range_dataset(num_elements, cluster)
    # Only reads from the local worker.
    assert_dataset_produces(dataset, list(range(num_elements)))


@pytest.mark.parametrize("num_local_workers,num_remote_workers", [(1, 0), (1, 3), (3, 0), (3, 3)])
def testReadFromLocalAndNonTpuWorkers_DynamicSharding(num_local_workers, num_remote_workers):
    """Ports WorkerTagsTest.testReadFromLocalAndNonTpuWorkers_DynamicSharding (tf.data starts 3
    remote workers whatever ``num_remote_workers`` says)."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers, num_remote_workers=3, worker_tags=[COLOCATED]
    )
    cluster.start_remote_worker(worker_tags=None)
    num_elements = 100
    dataset = make_distributed_range_dataset(
        num_elements, cluster, processing_mode=sluice.ShardingPolicy.DYNAMIC
    )
    assert_dataset_produces(dataset, list(range(num_elements)), assert_items_equal=True)


def testReadFromLocalWorker_StaticSharding():
    """Ports WorkerTagsTest.testReadFromLocalWorker_StaticSharding."""
    cluster = MultiProcessCluster(
        num_local_workers=1,
        num_remote_workers=3,
        worker_addresses=["localhost:%port%"] * 5,
        worker_tags=[COLOCATED],
    )
    cluster.start_remote_worker(worker_tags=None)
    num_elements = 100
    dataset = make_distributed_range_dataset(
        num_elements, cluster, processing_mode=sluice.ShardingPolicy.FILE_OR_DATA
    )
    # Static sharding reads only the local worker.
    assert_dataset_produces(dataset, list(range(0, num_elements, 5)))


@pytest.mark.parametrize("num_local_workers,num_remote_workers", [(1, 1), (1, 3), (3, 1), (3, 3)])
def testCoordinatedRead(num_local_workers, num_remote_workers):
    """Ports WorkerTagsTest.testCoordinatedRead."""
    # Its groups are made by a Python function, which runs in the workers' Python executors.
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers,
        num_remote_workers=num_remote_workers,
        worker_tags=[COLOCATED],
        python_executors=1,
    )
    num_consumers = 4
    dataset = make_coordinated_read_dataset(cluster, num_consumers)
    results = dataset.take(200)
    check_coordinated_read_groups(results, num_consumers)


@pytest.mark.parametrize(
    "num_local_workers,num_remote_workers",
    [
        (1, 1),
        (1, 3),
        (3, 1),
        (3, 3),
    ],
)
def testAddRemoteWorkersMidJob(num_local_workers, num_remote_workers):
    """Ports WorkerTagsTest.testAddRemoteWorkersMidJob."""
    cluster = MultiProcessCluster(
        num_local_workers=num_local_workers,
        num_remote_workers=num_remote_workers,
        worker_tags=[COLOCATED],
    )
    # More than 100 plus one element per core (elements are prefetched one per core).
    num_elements = 200 + multiprocessing.cpu_count()
    dataset = make_distributed_range_dataset(num_elements, cluster)
    get_next = Next(dataset)
    results = [get_next() for _ in range(100)]
    # Reads only from the two untagged workers.
    cluster.start_remote_worker(worker_tags=None)
    cluster.start_remote_worker(worker_tags=[COLOCATED])
    cluster.start_remote_worker(worker_tags=None)
    cluster.start_remote_worker(worker_tags=[COLOCATED])
    expect_num_workers_to_read = num_local_workers + 2
    # Wait for the new workers to register with the dispatcher.
    wait_until(
        lambda: cluster.num_registered_workers() >= num_local_workers + num_remote_workers + 4,
        "the new workers to register",
    )
    results += get_next.rest()
    assert_count_equal(results, expect_num_workers_to_read * list(range(num_elements)))


def testMultipleTags():
    """Ports WorkerTagsTest.testMultipleTags."""
    cluster = MultiProcessCluster(
        num_local_workers=1,
        num_remote_workers=3,
        worker_tags=[COLOCATED, "COLOCATED_2", "COLOCATED_3"],
    )
    num_elements = 100
    dataset = make_distributed_range_dataset(num_elements, cluster)
    # Only reads from the local worker.
    assert_dataset_produces(dataset, list(range(num_elements)))


def testUnusedTags():
    """Ports WorkerTagsTest.testUnusedTags."""
    cluster = MultiProcessCluster(
        num_local_workers=1,
        num_remote_workers=3,
        worker_tags=["Unused tag 1", "Unused tag 2", "Unused tag 3"],
    )
    num_elements = 100
    dataset = make_distributed_range_dataset(num_elements, cluster)
    # The tags have no effect: reads from every worker.
    assert_dataset_produces(dataset, 4 * list(range(num_elements)), assert_items_equal=True)


def testInvalidTag():
    """Ports WorkerTagsTest.testInvalidTag."""
    with pytest.raises(RuntimeError, match="Worker tags cannot be empty."):
        MultiProcessCluster(num_local_workers=1, num_remote_workers=3, worker_tags=["", COLOCATED])
