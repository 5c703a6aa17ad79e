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
# coordinated_read_test.py, against Sluice's Python API (numpy user functions, in-process
# servers on port 0, reads with deadlines; tf.data's eager/graph modes are not parameters).
"""Ports of tf.data service's coordinated read tests (``CoordinatedReadTest``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sluice import errors
from sluice.data import Dataset
from tfdata_conformance._cluster import (
    Next,
    TestCluster,
    check_coordinated_read_groups,
    get_dataset_output,
    make_coordinated_read_dataset,
    make_distributed_dataset,
    missing,
    not_applicable,
    py,
)



@pytest.mark.parametrize("num_consumers", [1, 2, 5])
@pytest.mark.parametrize("num_workers", [1, 3])
def testBasic(num_workers, num_consumers):
    """Ports CoordinatedReadTest.testBasic."""
    cluster = TestCluster(num_workers=num_workers, python_executors=1)
    ds = make_coordinated_read_dataset(cluster, num_consumers)
    results = ds.take(100)
    check_coordinated_read_groups(results, num_consumers)


def testConsumerRestart():
    """Ports CoordinatedReadTest.testConsumerRestart."""
    cluster = TestCluster(num_workers=1, python_executors=1)
    num_consumers = 3
    ds = make_coordinated_read_dataset(cluster, num_consumers)
    ds.take(20)
    ds2 = make_coordinated_read_dataset(cluster, num_consumers)
    with pytest.raises(errors.FailedPreconditionError, match="current round has already reached"):
        ds2.take(20)


@missing(
    "datasets as elements (a reduce_func returning from_tensors(window), flattened by "
    "flat_map(lambda x: x)); the reading threads fail and leave their step empty",
    raises=TypeError,
)
def testBucketizing():
    """Ports CoordinatedReadTest.testBucketizing: at each step, every consumer gets a batch of
    the same bucket. (tf.data reads the consumers with nested parallel interleaves; this reads
    host by host, each host's replicas in order, one thread per consumer.)"""
    cluster = TestCluster(num_workers=4, python_executors=1)
    num_elements = 100
    low_bucket_max = 30
    mid_bucket_max = 60
    bucket_boundaries = [low_bucket_max, mid_bucket_max]
    batch_size = 10
    num_consumer_hosts = 3
    replicas_per_consumer_host = 5
    num_consumers = num_consumer_hosts * replicas_per_consumer_host
    bucket_batch_sizes = [batch_size] * (len(bucket_boundaries) + 1)
    # The dataset the workers run.
    ds = Dataset.range(num_elements).map(lambda x: x.astype(np.int32))
    ds = ds.shuffle(num_elements)
    ds = ds.repeat()
    ds = ds.bucket_by_sequence_length(
        lambda x: x, bucket_boundaries, bucket_batch_sizes, drop_remainder=True
    )
    ds = ds.group_by_window(
        lambda x: np.int64(x[1]),
        lambda _, x: Dataset.from_tensors(x),
        window_size=num_consumers,
    )
    ds = ds.flat_map(lambda x: x)
    consumers = [
        Next(
            make_distributed_dataset(
                ds,
                cluster,
                job_name="test",
                consumer_index=consumer_index,
                num_consumers=num_consumers,
            )
        )
        for consumer_index in range(num_consumers)
    ]
    num_rounds = 4
    results = []
    for _ in range(num_rounds):
        step = [None] * num_consumers

        def read(i):
            step[i] = py(consumers[i]())

        threads = [threading.Thread(target=read, args=(i,)) for i in range(num_consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.extend(step)

    def get_bucket(elem):
        bucket_ind = 0
        while bucket_ind < len(bucket_boundaries) and elem >= bucket_boundaries[bucket_ind]:
            bucket_ind += 1
        return bucket_ind

    # The batches of each step are of one bucket.
    for i in range(0, len(results), num_consumers):
        batches = results[i : i + num_consumers]
        bucket_inds = [get_bucket(batch[0]) for batch in batches]
        for bucket_ind in bucket_inds[1:]:
            assert bucket_inds[0] == bucket_ind, f"Batches: {batches}, Buckets: {bucket_inds}"


@not_applicable("TF1 (v1 API) behaviour; testFiniteV2 is the current one")
def testFiniteV1():
    """Ports CoordinatedReadTest.testFiniteV1."""


def testFiniteV2():
    """Ports CoordinatedReadTest.testFiniteV2."""
    cluster = TestCluster(num_workers=1)
    num_elements = 100
    ds = Dataset.range(num_elements)
    ds = make_distributed_dataset(ds, cluster, job_name="test", consumer_index=0, num_consumers=1)
    with pytest.raises(
        errors.FailedPreconditionError,
        match="Round robin reads require that the input dataset has infinite cardinality, but "
        "the dataset has cardinality " + str(num_elements),
    ):
        get_dataset_output(ds)


def testCardinality():
    """Ports CoordinatedReadTest.testCardinality (in some revisions of tf.data's file): a
    coordinated read of an infinite dataset is infinite."""
    cluster = TestCluster(num_workers=1)
    ds = make_distributed_dataset(
        Dataset.range(10).repeat(), cluster, job_name="test", consumer_index=0, num_consumers=2
    )
    assert ds.cardinality() == -1
