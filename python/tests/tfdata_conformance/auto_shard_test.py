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
# auto_shard_test.py, against Sluice's Python API (local workers run in this process, remote
# ones in a helper process; reads with deadlines; eager/graph modes are not parameters).
"""Ports of tf.data service's auto-sharding tests (``AutoShardTest``): static sharding over a
fixed worker list, read from the local worker."""

from __future__ import annotations

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TFRecordDataset
from sluice.io import TFRecordWriter
from tfdata_conformance._cluster import (
    MultiProcessCluster,
    assert_dataset_produces,
    bug,
    get_dataset_output,
    make_distributed_dataset,
)

ShardingPolicy = sluice.ShardingPolicy


def _make_service_cluster(
    num_workers, local_shard_index, data_root, worker_addresses=None, python_executors=0
):
    """A cluster whose worker ``local_shard_index`` (in registration order) runs in this
    process, the others in another process."""
    if worker_addresses is None:
        worker_addresses = ["localhost" for _ in range(num_workers)]
    cluster = MultiProcessCluster(
        num_local_workers=0,
        num_remote_workers=0,
        worker_addresses=worker_addresses,
        data_roots=[data_root],
        python_executors=python_executors,
    )
    for _ in range(local_shard_index):
        cluster.start_remote_worker()
    cluster.start_local_worker()
    for _ in range(num_workers - local_shard_index - 1):
        cluster.start_remote_worker()
    return cluster


def _shard_hint():
    """tf.data's ``SHARD_HINT``, as a user would look it up."""
    return sluice.data.experimental.SHARD_HINT


@pytest.fixture
def files(tmp_path):
    """tf.data's ``TFRecordTestBase._createFiles``: 10 files of 10 records, record r of file f
    being ``b"Record r of file f"``."""
    filenames = []
    for i in range(10):
        path = tmp_path / f"tf_record.{i}.txt"
        with TFRecordWriter(str(path)) as writer:
            for j in range(10):
                writer.write(b"Record %d of file %d" % (j, i))
        filenames.append(str(path))
    return filenames


@pytest.fixture
def root(tmp_path):
    return str(tmp_path)


def _records(files, records):
    return [b"Record %d of file %d" % (record, file) for file in files for record in records]


def _policies(*policies):
    """``policies`` as parameters."""
    return [pytest.param(p, id=p.name) for p in policies]


def _file_policies():
    """FILE_OR_DATA and FILE, for cases whose files are read by a ``flat_map`` of
    ``list_files``: both need FILE sharding through the ``flat_map``."""
    return [
        pytest.param(ShardingPolicy.FILE_OR_DATA, id="FILE_OR_DATA"),
        pytest.param(ShardingPolicy.FILE, id="FILE"),
    ]


@pytest.mark.parametrize("sharding_policy", [ShardingPolicy.DATA, ShardingPolicy.FILE_OR_DATA])
def testRangeDataset_AutoShard(sharding_policy, root):
    """Ports AutoShardTest.testRangeDataset_AutoShard."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = Dataset.range(20)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=sharding_policy, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, [1, 6, 11, 16])


def testRangeDataset_FileShard(root):
    """Ports AutoShardTest.testRangeDataset_FileShard."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = Dataset.range(20)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=ShardingPolicy.FILE, target_workers="LOCAL"
    )
    with pytest.raises(errors.NotFoundError, match="Found an unshardable source dataset"):
        get_dataset_output(dataset)


def testRangeDataset_ShardHint(root):
    """Ports AutoShardTest.testRangeDataset_ShardHint."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = Dataset.range(20)
    dataset = dataset.shard(_shard_hint(), _shard_hint())
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=ShardingPolicy.HINT, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, [1, 6, 11, 16])


def testRangeDataset_NoShardHint(root):
    """Ports AutoShardTest.testRangeDataset_NoShardHint."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = Dataset.range(20)
    # No SHARD_HINT: the given sharding arguments are used.
    dataset = dataset.shard(num_shards=1, index=0)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=ShardingPolicy.HINT, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, list(range(20)))


def testRangeDataset_NoShard(root):
    """Ports AutoShardTest.testRangeDataset_NoShard."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.OFF,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, list(range(20)))


def testRangeDataset_OneWorker(root):
    """Ports AutoShardTest.testRangeDataset_OneWorker."""
    cluster = _make_service_cluster(num_workers=1, local_shard_index=0, data_root=root)
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, list(range(20)))


def testRangeDataset_ReadFromAllWorkers(root):
    """Ports AutoShardTest.testRangeDataset_ReadFromAllWorkers."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="ANY",
    )
    with pytest.raises(
        errors.InvalidArgumentError, match="Static sharding requires reading from local workers"
    ):
        get_dataset_output(dataset)


def _tfrecords(files, shuffle=False):
    dataset = Dataset.list_files(files, shuffle=shuffle)
    return dataset.flat_map(TFRecordDataset)


@pytest.mark.parametrize(
    "sharding_policy", _file_policies()
)
def testTFRecordDataset_AutoShard(sharding_policy, files, root):
    """Ports AutoShardTest.testTFRecordDataset_AutoShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files),
        cluster=cluster,
        processing_mode=sharding_policy,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, _records((3, 8), range(10)))


@pytest.mark.parametrize(
    "sharding_policy", _file_policies()
)
def testTFRecordDataset_ShuffleFileList(sharding_policy, files, root):
    """Ports AutoShardTest.testTFRecordDataset_ShuffleFileList."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files, shuffle=True),
        cluster=cluster,
        processing_mode=sharding_policy,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, _records((3, 8), range(10)), assert_items_equal=True)


def testTFRecordDataset_DataShard(files, root):
    """Ports AutoShardTest.testTFRecordDataset_DataShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files),
        cluster=cluster,
        processing_mode=ShardingPolicy.DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, _records(range(10), (3, 8)))


def testTFRecordDataset_HintDataShard(files, root):
    """Ports AutoShardTest.testTFRecordDataset_HintDataShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = _tfrecords(files)
    dataset = dataset.shard(_shard_hint(), _shard_hint())
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=ShardingPolicy.HINT, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, _records(range(10), (3, 8)))


def testTFRecordDataset_HintFileShard(files, root):
    """Ports AutoShardTest.testTFRecordDataset_HintFileShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = Dataset.list_files(files, shuffle=False)
    dataset = dataset.shard(_shard_hint(), _shard_hint())
    dataset = dataset.flat_map(TFRecordDataset)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=ShardingPolicy.HINT, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, _records((3, 8), range(10)))


def testTFRecordDataset_NoShard(files, root):
    """Ports AutoShardTest.testTFRecordDataset_NoShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files),
        cluster=cluster,
        processing_mode=ShardingPolicy.OFF,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, _records(range(10), range(10)))


def testTFRecordDataset_ReadFromAllWorkers(files, root):
    """Ports AutoShardTest.testTFRecordDataset_ReadFromAllWorkers."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="ANY",
    )
    with pytest.raises(
        errors.InvalidArgumentError, match="Static sharding requires reading from local workers"
    ):
        get_dataset_output(dataset)


@pytest.mark.parametrize(
    "sharding_policy", _file_policies()
)
def testTFRecordDataset_FewerFilesThanWorkers(sharding_policy, files, root):
    """Ports AutoShardTest.testTFRecordDataset_FewerFilesThanWorkers."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files[:4]),
        cluster=cluster,
        processing_mode=sharding_policy,
        target_workers="LOCAL",
    )
    with pytest.raises(
        errors.InvalidArgumentError, match="not enough for the required 5 shards/workers."
    ):
        get_dataset_output(dataset)


def testTFRecordDataset_FewerFilesThanWorkers_DataShard(files, root):
    """Ports AutoShardTest.testTFRecordDataset_FewerFilesThanWorkers_DataShard."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    dataset = make_distributed_dataset(
        _tfrecords(files[:4]),
        cluster=cluster,
        processing_mode=ShardingPolicy.DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, _records(range(4), (3, 8)), assert_items_equal=True)


@pytest.mark.parametrize("sharding_policy", [ShardingPolicy.FILE_OR_DATA, ShardingPolicy.DATA])
def testBatchDataset(sharding_policy, root):
    """Ports AutoShardTest.testBatchDataset."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=1, data_root=root)
    dataset = Dataset.range(20).batch(batch_size=3, drop_remainder=False)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=sharding_policy, target_workers="LOCAL"
    )
    assert_dataset_produces(dataset, [[3, 4, 5], [18, 19]])


def _interleaved_records(files):
    dataset = Dataset.list_files(files, shuffle=False)
    return dataset.interleave(
        TFRecordDataset, cycle_length=10, num_parallel_calls=sluice.data.AUTOTUNE
    )


def testInterleaveDataset(files, root):
    """Ports AutoShardTest.testInterleaveDataset."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=3, data_root=root)
    dataset = _interleaved_records(files)
    dataset = dataset.prefetch(buffer_size=sluice.data.AUTOTUNE)
    dataset = make_distributed_dataset(
        dataset,
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    dataset = dataset.prefetch(buffer_size=sluice.data.AUTOTUNE)
    expected = [b"Record %d of file %d" % (record, file) for record in range(10) for file in (3, 8)]
    assert_dataset_produces(dataset, expected)


def testZipDataset(files, root):
    """Ports AutoShardTest.testZipDataset."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=3, data_root=root)
    dataset = Dataset.zip((_interleaved_records(files), _interleaved_records(files)))
    dataset = dataset.prefetch(buffer_size=sluice.data.AUTOTUNE)
    dataset = make_distributed_dataset(
        dataset,
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    expected = [
        (b"Record %d of file %d" % (record, file), b"Record %d of file %d" % (record, file))
        for record in range(10)
        for file in (3, 8)
    ]
    assert_dataset_produces(dataset, expected)


def testConcatenateDataset(files, root):
    """Ports AutoShardTest.testConcatenateDataset."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=3, data_root=root)
    dataset = _interleaved_records(files).concatenate(_interleaved_records(files))
    dataset = dataset.prefetch(buffer_size=sluice.data.AUTOTUNE)
    dataset = make_distributed_dataset(
        dataset,
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    expected = [b"Record %d of file %d" % (record, file) for record in range(10) for file in (3, 8)]
    expected += expected
    assert_dataset_produces(dataset, expected)


def testEmptyDataset(root):
    """Ports AutoShardTest.testEmptyDataset."""
    cluster = _make_service_cluster(num_workers=5, local_shard_index=3, data_root=root)
    dataset = make_distributed_dataset(
        Dataset.range(0),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, [])


def testAnonymousPorts(root):
    """Ports AutoShardTest.testAnonymousPorts."""
    cluster = _make_service_cluster(
        num_workers=5,
        local_shard_index=3,
        data_root=root,
        worker_addresses=["localhost:%port%" for _ in range(5)],
    )
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, [3, 8, 13, 18])


def testNamedPorts(root):
    """Ports AutoShardTest.testNamedPorts."""
    cluster = _make_service_cluster(
        num_workers=5,
        local_shard_index=3,
        data_root=root,
        worker_addresses=["localhost:%port_worker%" for _ in range(5)],
    )
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    assert_dataset_produces(dataset, [3, 8, 13, 18])


def testInvalidPorts(root):
    """Ports AutoShardTest.testInvalidPorts."""
    with pytest.raises(RuntimeError, match="The worker's address is not configured"):
        _make_service_cluster(
            num_workers=5,
            local_shard_index=0,
            data_root=root,
            worker_addresses=["localhost:worker" for _ in range(5)],
        )


def testEmptyWorkerList(root):
    """Ports AutoShardTest.testEmptyWorkerList."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=1, data_root=root, worker_addresses=[]
    )
    dataset = make_distributed_dataset(
        Dataset.range(20),
        cluster=cluster,
        processing_mode=ShardingPolicy.FILE_OR_DATA,
        target_workers="LOCAL",
    )
    with pytest.raises(errors.NotFoundError, match="Worker .* is not in the workers list."):
        get_dataset_output(dataset)


def testWorkerNotFound(root):
    """Ports AutoShardTest.testWorkerNotFound."""
    worker_addresses = [f"fake_worker_{i}" for i in range(5)]
    with pytest.raises(RuntimeError, match="The worker's address is not configured"):
        _make_service_cluster(
            num_workers=5, local_shard_index=0, data_root=root, worker_addresses=worker_addresses
        )


def testMoreWorkersThanConfigured(root):
    """Ports AutoShardTest.testMoreWorkersThanConfigured."""
    worker_addresses = ["localhost:%port%"]
    with pytest.raises(
        RuntimeError, match="other workers are already running at the configured host"
    ):
        _make_service_cluster(
            num_workers=5, local_shard_index=1, data_root=root, worker_addresses=worker_addresses
        )


@pytest.mark.parametrize("sharding_policy", _policies(*ShardingPolicy))
def testEnumerateShardingPolicies(sharding_policy, files, root):
    """Ports AutoShardTest.testEnumerateShardingPolicies: every sharding policy reads without
    an error."""
    cluster = _make_service_cluster(
        num_workers=5, local_shard_index=3, data_root=root, python_executors=1
    )
    distributed_dataset = make_distributed_dataset(
        _tfrecords(files),
        cluster=cluster,
        processing_mode=sharding_policy,
        target_workers="LOCAL",
    )
    get_dataset_output(distributed_dataset)
