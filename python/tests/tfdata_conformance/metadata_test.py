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
# metadata_test.py, against Sluice's Python API (numpy user functions, in-process servers on
# port 0, reads with deadlines; tf.data's eager/graph modes and API versions are not
# parameters).
"""Ports of tf.data service's metadata tests (``DataServiceMetadataTest``)."""

from __future__ import annotations

import pytest

import sluice
from sluice.data import Dataset
from tfdata_conformance._cluster import (
    NO_WORK_DIR,
    TestCluster,
    assert_dataset_produces,
    make_distributed_dataset,
    missing,
    not_applicable,
)

ShardingPolicy = sluice.ShardingPolicy
INFINITE = -1
UNKNOWN = -2


def _shard_hint():
    """tf.data's ``SHARD_HINT``, as a user would look it up."""
    return sluice.data.experimental.SHARD_HINT


def _infinite_dataset_with_hint_shard():
    return Dataset.range(10).shard(_shard_hint(), _shard_hint()).repeat()


def _empty_dataset_with_hint_shard():
    return Dataset.range(0).shard(_shard_hint(), _shard_hint())



# (name, dataset_fn, sharding_policy, expected cardinality): tf.data's v2 cases, then those of
# both API versions.
_CASES = [
    ("NoShardingInfinite", lambda: Dataset.range(10).repeat(), ShardingPolicy.OFF, INFINITE),
    (
        "DynamicShardingInfinite",
        lambda: Dataset.range(5).repeat(),
        ShardingPolicy.DYNAMIC,
        INFINITE,
    ),
    ("DataShardingInfinite", lambda: Dataset.range(10).repeat(), ShardingPolicy.DATA, INFINITE),
    ("NoShardingZero", lambda: Dataset.range(0), ShardingPolicy.OFF, 0),
    ("DynamicShardingZero", lambda: Dataset.range(0), ShardingPolicy.DYNAMIC, 0),
    ("DataShardingZero", lambda: Dataset.range(0), ShardingPolicy.DATA, 0),
    ("FileOrDataShardingZero", lambda: Dataset.range(0), ShardingPolicy.FILE_OR_DATA, 0),
    ("HintShardingZero", _empty_dataset_with_hint_shard, ShardingPolicy.HINT, UNKNOWN),
    ("Finite", lambda: Dataset.range(10), ShardingPolicy.OFF, UNKNOWN),
    (
        "FileOrDataShardingUnknown",
        lambda: Dataset.range(10).repeat(),
        ShardingPolicy.FILE_OR_DATA,
        UNKNOWN,
    ),
    ("HintShardingUnknown", _infinite_dataset_with_hint_shard, ShardingPolicy.HINT, UNKNOWN),
]


def _params():
    return [
        pytest.param(fn, policy, expected, id=name)
        for name, fn, policy, expected in _CASES
    ]


@pytest.mark.parametrize("dataset_fn,sharding_policy,expected_result", _params())
def testCardinality(dataset_fn, sharding_policy, expected_result):
    """Ports DataServiceMetadataTest.testCardinality."""
    cluster = TestCluster(num_workers=2)
    dataset = dataset_fn()
    dataset = make_distributed_dataset(dataset, cluster=cluster, processing_mode=sharding_policy)
    assert dataset.cardinality() == expected_result


@pytest.mark.parametrize("dataset_fn,sharding_policy,expected_result", _params())
def testFromDatasetIdCardinality(dataset_fn, sharding_policy, expected_result):
    """Ports DataServiceMetadataTest.testFromDatasetIdCardinality."""
    cluster = TestCluster(num_workers=2)
    dataset = dataset_fn()
    dataset_id = sluice.register_dataset(cluster.target, dataset=dataset)
    dataset = sluice.from_dataset_id(
        processing_mode=sharding_policy,
        service=cluster.target,
        dataset_id=dataset_id,
        element_spec=dataset.element_spec,
    )
    assert dataset.cardinality() == expected_result


def testFromDatasetIdDoesntRequireElementSpec():
    """Ports DataServiceMetadataTest.testFromDatasetIdDoesntRequireElementSpec."""
    cluster = TestCluster(num_workers=1, work_dir=NO_WORK_DIR, fault_tolerant_mode=False)
    num_elements = 10
    dataset = Dataset.range(num_elements)
    dataset_id = sluice.register_dataset(cluster.dispatcher_address(), dataset)
    dataset = sluice.from_dataset_id(
        processing_mode=ShardingPolicy.OFF,
        service=cluster.dispatcher_address(),
        dataset_id=dataset_id,
    )
    assert_dataset_produces(dataset, list(range(num_elements)))


@not_applicable("graph mode: from_dataset_id needs the element spec given in graph mode")
def testElementSpecGraphMode():
    """Ports DataServiceMetadataTest.testElementSpecGraphMode."""


@not_applicable("tf.function: a dataset id registered inside a traced function")
def testElementSpecMixedMode():
    """Ports DataServiceMetadataTest.testElementSpecMixedMode."""


@pytest.mark.parametrize("compression", [None, "AUTO"])
def testFromDatasetIdOmitsCompression(compression):
    """Ports DataServiceMetadataTest.testFromDatasetIdOmitsCompression (a Python function
    stands for ``numpy_function``)."""
    cluster = TestCluster(num_workers=1, python_executors=1)
    dataset = Dataset.from_tensor_slices(list("abcdefghijklmnopqrstuvwxyz"))

    def to_upper(x):
        return x.decode("utf-8").upper().encode()

    dataset = dataset.map(to_upper, num_parallel_calls=sluice.data.AUTOTUNE)
    dataset_id = sluice.register_dataset(cluster.target, dataset=dataset, compression=compression)
    dataset = sluice.from_dataset_id(
        processing_mode=ShardingPolicy.OFF,
        service=cluster.target,
        dataset_id=dataset_id,
        element_spec=dataset.element_spec,
    )
    assert_dataset_produces(dataset, [c.encode() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"])


@pytest.mark.parametrize("compression", [None, "AUTO"])
def testFromDatasetIdOmitsElementSpecAndCompression(compression):
    """Ports DataServiceMetadataTest.testFromDatasetIdOmitsElementSpecAndCompression."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.from_tensor_slices(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    dataset_id = sluice.register_dataset(cluster.target, dataset=dataset, compression=compression)
    dataset = sluice.from_dataset_id(
        processing_mode=ShardingPolicy.OFF, service=cluster.target, dataset_id=dataset_id
    )
    assert_dataset_produces(dataset, [c.encode() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"])
