# Copyright 2022 The TensorFlow Authors. All Rights Reserved.
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
# cross_trainer_cache_test.py, against Sluice's Python API (in-process servers on port 0,
# reads with deadlines; tf.data's eager/graph modes are not parameters).
"""Ports of tf.data service's cross-trainer cache tests (``CrossTrainerCacheTest``)."""

from __future__ import annotations

import multiprocessing

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset
from tfdata_conformance._cluster import (
    Next,
    TestCluster,
    assert_dataset_produces,
    bug,
    get_dataset_output,
    make_distributed_dataset,
    not_applicable,
    py,
)

CrossTrainerCache = sluice.CrossTrainerCache


def _create_cluster(num_workers, cross_trainer_cache_size_bytes=None, python_executors=0):
    """tf.data's ``_create_cluster``: workers with a cross-trainer cache of the given size
    (tf.data's test default, 10 GiB, is Sluice's default)."""
    cluster = TestCluster(num_workers=0, python_executors=python_executors)
    for _ in range(num_workers):
        cluster.add_worker(cross_trainer_cache_size_bytes=cross_trainer_cache_size_bytes)
    return cluster


def _infinite():
    return Dataset.range(10000000).repeat()


def testEnableCrossTrainerCache():
    """Ports CrossTrainerCacheTest.testEnableCrossTrainerCache."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    # The second client reads the same data from the cross-trainer cache.
    dataset2 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 2")
    )
    assert_dataset_produces(dataset2.take(10), list(range(10)))


def testFromDatasetId():
    """Ports CrossTrainerCacheTest.testFromDatasetId."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset_id1 = sluice.register_dataset(cluster.target, dataset, dataset_id="dataset_id")
    dataset1 = sluice.from_dataset_id(
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.target,
        dataset_id=dataset_id1,
        element_spec=dataset.element_spec,
        job_name="job",
        cross_trainer_cache=CrossTrainerCache(trainer_id="Trainer 1"),
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    dataset_id2 = sluice.register_dataset(cluster.target, dataset, dataset_id="dataset_id")
    dataset2 = sluice.from_dataset_id(
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.target,
        dataset_id=dataset_id2,
        element_spec=dataset.element_spec,
        job_name="job",
        cross_trainer_cache=CrossTrainerCache(trainer_id="Trainer 2"),
    )
    assert_dataset_produces(dataset2.take(10), list(range(10)))


def testDisableCrossTrainerCacheByDefault():
    """Ports CrossTrainerCacheTest.testDisableCrossTrainerCacheByDefault."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(dataset, cluster, job_name="job")
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    # The clients share the job: the second cannot read what the first read.
    dataset2 = make_distributed_dataset(dataset, cluster, job_name="job")
    output = get_dataset_output(dataset2.take(10))
    assert output[0] >= 10


def testConcurrentReaders():
    """Ports CrossTrainerCacheTest.testConcurrentReaders: a cache of (cores + 8) elements of
    423 bytes."""
    num_cpus = multiprocessing.cpu_count()
    cluster = _create_cluster(num_workers=1, cross_trainer_cache_size_bytes=(num_cpus + 8) * 423)
    num_readers = 20
    num_elements = 50
    dataset = _infinite()
    iterators = []
    for i in range(num_readers):
        distributed_dataset = make_distributed_dataset(
            dataset,
            cluster,
            job_name="job",
            cross_trainer_cache=CrossTrainerCache(trainer_id=f"Trainer {i}"),
            max_outstanding_requests=1,
        )
        iterators.append(Next(distributed_dataset))
    for i in range(num_elements):
        # All the readers read the same element in one step.
        for j in range(num_readers):
            assert py(iterators[j]()) == i


def testSlowClientSkipsData():
    """Ports CrossTrainerCacheTest.testSlowClientSkipsData."""
    cluster = _create_cluster(num_workers=1, cross_trainer_cache_size_bytes=500)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    assert_dataset_produces(dataset1.take(200), list(range(200)))
    dataset2 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 2")
    )
    output = get_dataset_output(dataset2.take(200))
    # The small cache lost the beginning; the infinite dataset still gives 200 elements.
    assert output[0] > 0
    assert len(output) == 200


def testSmallCache():
    """Ports CrossTrainerCacheTest.testSmallCache."""
    cluster = _create_cluster(num_workers=1, cross_trainer_cache_size_bytes=500)
    dataset = _infinite()
    num_readers = 20
    for i in range(num_readers):
        # A small cache may drop old data; the infinite dataset still gives every trainer 200.
        distributed_dataset = make_distributed_dataset(
            dataset,
            cluster,
            job_name="job",
            cross_trainer_cache=CrossTrainerCache(trainer_id=f"Trainer {i}"),
        )
        output = get_dataset_output(distributed_dataset.take(200))
        assert len(output) == 200


def testShuffleDataset():
    """Ports CrossTrainerCacheTest.testShuffleDataset."""
    cluster = _create_cluster(num_workers=1)
    dataset = Dataset.range(10000000).repeat().shuffle(buffer_size=100)
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    output1 = get_dataset_output(dataset1.take(10))
    dataset2 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 2")
    )
    output2 = get_dataset_output(dataset2.take(10))
    assert output1 == output2


def testSameTrainerID():
    """Ports CrossTrainerCacheTest.testSameTrainerID."""
    # Jobs of the same trainer do not reuse data from the cache.
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer ID")
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    dataset2 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer ID")
    )
    output = get_dataset_output(dataset2.take(10))
    assert output[0] >= 10


def testDifferentJobNames():
    """Ports CrossTrainerCacheTest.testDifferentJobNames."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job1", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    dataset2 = make_distributed_dataset(
        dataset, cluster, job_name="job2", cross_trainer_cache=CrossTrainerCache("Trainer 2")
    )
    assert_dataset_produces(dataset2.take(10), list(range(10)))


def testDynamicSharding():
    """Ports CrossTrainerCacheTest.testDynamicSharding."""
    cluster = _create_cluster(num_workers=2)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset,
        cluster,
        processing_mode=sluice.ShardingPolicy.DYNAMIC,
        job_name="job",
        cross_trainer_cache=CrossTrainerCache("Trainer 1"),
    )
    output1 = get_dataset_output(dataset1.take(100))
    # The second client reads the same data from the cross-trainer cache.
    dataset2 = make_distributed_dataset(
        dataset,
        cluster,
        processing_mode=sluice.ShardingPolicy.DYNAMIC,
        job_name="job",
        cross_trainer_cache=CrossTrainerCache("Trainer 2"),
    )
    output2 = get_dataset_output(dataset2.take(100))
    # The intersection is not empty.
    assert set(output1) & set(output2)


def testNoCompression():
    """Ports CrossTrainerCacheTest.testNoCompression."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset,
        cluster,
        job_name="job",
        compression=None,
        cross_trainer_cache=CrossTrainerCache("Trainer 1"),
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    dataset2 = make_distributed_dataset(
        dataset,
        cluster,
        job_name="job",
        compression=None,
        cross_trainer_cache=CrossTrainerCache("Trainer 2"),
    )
    assert_dataset_produces(dataset2.take(10), list(range(10)))


def testCompressionMismatch():
    """Ports CrossTrainerCacheTest.testCompressionMismatch."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    with pytest.raises(errors.InvalidArgumentError, match="Data type mismatch"):
        dataset2 = make_distributed_dataset(
            dataset,
            cluster,
            job_name="job",
            compression=None,
            cross_trainer_cache=CrossTrainerCache("Trainer 1"),
        )
        get_dataset_output(dataset2.take(10))


def testRequiresJobName():
    """Ports CrossTrainerCacheTest.testRequiresJobName."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Cross-trainer caching requires named jobs. Got empty `job_name`.",
    ):
        dataset = make_distributed_dataset(
            dataset, cluster, job_name=None, cross_trainer_cache=CrossTrainerCache("Trainer 1")
        )
        get_dataset_output(dataset)


@pytest.mark.parametrize("range_", [0, 10])
def testRequiresInfiniteDataset(range_):
    """Ports CrossTrainerCacheTest.testRequiresInfiniteDataset."""
    cluster = _create_cluster(num_workers=1, python_executors=1)
    dataset = Dataset.range(range_).map(lambda x: x + 1)
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Cross-trainer caching requires the input dataset to be infinite.",
    ):
        dataset = dataset.apply(
            sluice.distribute(
                processing_mode=sluice.ShardingPolicy.OFF,
                service=cluster.target,
                job_name="job_name",
                cross_trainer_cache=CrossTrainerCache(trainer_id="Trainer ID"),
            )
        )
        get_dataset_output(dataset)


def testMultipleIterationsForOneDatasetEagerMode():
    """Ports CrossTrainerCacheTest.testMultipleIterationsForOneDatasetEagerMode."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    # Each iteration is a new job that does not reuse cached data: refused.
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Cross-trainer caching requires infinite datasets and disallows "
        "multiple repetitions of the same dataset.",
    ):
        get_dataset_output(dataset1.take(10))
        get_dataset_output(dataset1.take(10))
        get_dataset_output(dataset1.take(10))


@not_applicable("graph mode: one graph iterator re-initialized three times")
def testMultipleIterationsForOneDatasetGraphMode():
    """Ports CrossTrainerCacheTest.testMultipleIterationsForOneDatasetGraphMode."""


def testDisallowCoordinatedRead():
    """Ports CrossTrainerCacheTest.testDisallowCoordinatedRead."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Cross-trainer caching does not support coordinated reads.",
    ):
        dataset = make_distributed_dataset(
            dataset,
            cluster,
            job_name="job",
            num_consumers=1,
            consumer_index=0,
            cross_trainer_cache=CrossTrainerCache("Trainer 1"),
        )
        get_dataset_output(dataset)


def testNamedJobMismatch():
    """Ports CrossTrainerCacheTest.testNamedJobMismatch."""
    cluster = _create_cluster(num_workers=1)
    dataset = _infinite()
    dataset1 = make_distributed_dataset(
        dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache("Trainer 1")
    )
    assert_dataset_produces(dataset1.take(10), list(range(10)))
    with pytest.raises(
        errors.InvalidArgumentError, match="Existing cross-trainer cache: <enabled>; got <disabled>"
    ):
        dataset2 = make_distributed_dataset(
            dataset, cluster, job_name="job", cross_trainer_cache=None
        )
        get_dataset_output(dataset2)


def testRequiresNonEmptyTrainerID():
    """Ports CrossTrainerCacheTest.testRequiresNonEmptyTrainerID."""
    cluster = _create_cluster(num_workers=2)
    dataset = _infinite()
    with pytest.raises(
        ValueError, match="tf.data service cross-trainer cache requires a non-empty trainer ID."
    ):
        make_distributed_dataset(
            dataset, cluster, job_name="job", cross_trainer_cache=CrossTrainerCache(trainer_id=None)
        )
