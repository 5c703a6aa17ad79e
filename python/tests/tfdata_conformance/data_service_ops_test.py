# Copyright 2020 The TensorFlow Authors. All Rights Reserved.
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
# data_service_ops_test.py, against Sluice's Python API (numpy user functions, in-process
# servers on port 0, reads with deadlines; tf.data's eager/graph modes are not parameters).
"""Ports of tf.data service's ops tests (``DataServiceOpsTest``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TensorSpec
from tfdata_conformance._cluster import (
    NO_WORK_DIR,
    Next,
    TestCluster,
    all_cluster_configurations,
    assert_count_equal,
    assert_dataset_produces,
    bug,
    deliberate,
    get_dataset_output,
    make_distributed_dataset,
    make_distributed_range_dataset,
    missing,
    not_applicable,
    py,
    wait_until,
)


@pytest.mark.parametrize("work_dir,fault_tolerant_mode", all_cluster_configurations())
def testDistributeBasic(work_dir, fault_tolerant_mode):
    """Ports DataServiceOpsTest.testDistributeBasic."""
    cluster = TestCluster(num_workers=1, work_dir=work_dir, fault_tolerant_mode=fault_tolerant_mode)
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster)
    assert_dataset_produces(ds, list(range(num_elements)))


def testDistributeInvalidCompression():
    """Ports DataServiceOpsTest.testDistributeInvalidCompression."""
    cluster = TestCluster(num_workers=1)
    with pytest.raises(ValueError, match="Invalid `compression` argument"):
        make_distributed_range_dataset(10, cluster, compression="foo")


@not_applicable("SparseTensor: TensorFlow's composite tensor type; Sluice's elements are numpy")
def testDistributeSparse():
    """Ports DataServiceOpsTest.testDistributeSparse."""


@missing("Dataset.ragged_batch")
def testDistributeRagged():
    """Ports DataServiceOpsTest.testDistributeRagged (``dense_to_ragged_batch`` is
    ``Dataset.ragged_batch`` in tf.data's current API)."""
    cluster = TestCluster(num_workers=1, python_executors=1)
    ds = Dataset.from_tensor_slices([1, 5, 3, 2, 8])
    ds = ds.map(lambda x: np.arange(x))
    ds = ds.ragged_batch(2)
    ds = make_distributed_dataset(ds, cluster)
    results = get_dataset_output(ds)
    assert results[0] == [[0], [0, 1, 2, 3, 4]]
    assert results[1] == [[0, 1, 2], [0, 1]]
    assert results[2] == [[0, 1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("init_source", ["textfile", "keyvaluetensor", "dataset"])
def testDistributeLookupTable(init_source, tmp_path):
    """Ports DataServiceOpsTest.testDistributeLookupTable: a static table (a dict built from a
    text file, from keys and values, or from a dataset) looked up in a map on the workers."""
    cluster = TestCluster(num_workers=1, python_executors=1)
    vals = [10, 11]
    if init_source == "textfile":
        path = tmp_path / "table.txt"
        path.write_text("\n".join(str(v) for v in vals) + "\n")
        table = {i: int(line) for i, line in enumerate(path.read_text().splitlines())}
    elif init_source == "keyvaluetensor":
        table = dict(zip(range(len(vals)), vals))
    else:
        pairs = Dataset.from_tensor_slices((np.arange(len(vals)), np.array(vals)))
        table = {int(k): int(v) for k, v in pairs}
    ds = Dataset.range(3)
    ds = ds.map(lambda x: np.int64(table.get(int(x), -1)))
    ds = make_distributed_dataset(ds, cluster)
    assert_dataset_produces(ds, [10, 11, -1])


@pytest.mark.parametrize("value_rank", [0, 1])
def testDistributeMutableHashTable(value_rank):
    """Ports DataServiceOpsTest.testDistributeMutableHashTable (a dict filled before the
    dataset is distributed)."""

    def value(v):
        for _ in range(value_rank):
            v = [v, v]
        return v

    v1 = value(10)
    v2 = value(11)
    default_value = value(-1)
    cluster = TestCluster(num_workers=1, python_executors=1)
    table = {}
    table.update({0: v1, 1: v2})
    ds = Dataset.range(3)
    ds = ds.map(lambda x: np.array(table.get(int(x), default_value), dtype=np.int64))
    ds = make_distributed_dataset(ds, cluster)
    assert_dataset_produces(ds, [v1, v2, default_value])


@pytest.mark.parametrize("shuffle_seed", [None, 10])
def testShuffleOrder(shuffle_seed):
    """Ports DataServiceOpsTest.testShuffleOrder."""
    num_elements = 100
    cluster = TestCluster(num_workers=2)
    ds = Dataset.range(num_elements)
    ds = ds.shuffle(num_elements, seed=shuffle_seed)
    ds = make_distributed_dataset(ds, cluster)
    output = get_dataset_output(ds)
    # Two sequences of range(num_elements), interleaved: equal orders iff the seeds match.
    first_order = {}
    second_order = {}
    for element in output:
        if element in first_order:
            second_order[element] = len(second_order)
        else:
            first_order[element] = len(first_order)
    if shuffle_seed is None:
        assert first_order != second_order
    else:
        assert first_order == second_order


def testMultipleEpochs():
    """Ports DataServiceOpsTest.testMultipleEpochs."""
    cluster = TestCluster(num_workers=1)
    num_elements = 3
    ds = make_distributed_range_dataset(num_elements, cluster)
    for _ in range(10):
        assert_dataset_produces(ds, list(range(num_elements)))


def testRepeatedDataset():
    """Ports DataServiceOpsTest.testRepeatedDataset."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    num_repetitions = 5
    ds = make_distributed_range_dataset(num_elements, cluster)
    ds = ds.repeat(num_repetitions)
    assert_dataset_produces(ds, num_repetitions * list(range(num_elements)))


def testConcurrentEpoch():
    """Ports DataServiceOpsTest.testConcurrentEpoch."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    num_datasets = 3
    get_nexts = []
    results = []
    for _ in range(num_datasets):
        ds = make_distributed_range_dataset(num_elements, cluster)
        get_nexts.append(Next(ds))
        results.append([])
    for _ in range(num_elements):
        for dataset_ind in range(num_datasets):
            results[dataset_ind].append(py(get_nexts[dataset_ind]()))
    for result in results:
        assert list(range(num_elements)) == result


def testMultiWorker():
    """Ports DataServiceOpsTest.testMultiWorker."""
    num_workers = 3
    cluster = TestCluster(num_workers=num_workers)
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster)
    assert_dataset_produces(ds, num_workers * list(range(num_elements)), assert_items_equal=True)


def testFromGenerator():
    """Ports DataServiceOpsTest.testFromGenerator."""
    cluster = TestCluster(num_workers=1, python_executors=1)

    def generator():
        yield from range(10)

    dataset = Dataset.from_generator(
        generator, output_signature=TensorSpec(shape=(), dtype=np.int64)
    )
    dataset = dataset.apply(
        sluice.distribute(sluice.ShardingPolicy.OFF, cluster.dispatcher_address())
    )
    assert_dataset_produces(dataset, list(range(10)))


def testMaxOutstandingRequests():
    """Ports DataServiceOpsTest.testMaxOutstandingRequests."""
    num_workers = 3
    cluster = TestCluster(num_workers=num_workers)
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, max_outstanding_requests=1)
    assert_dataset_produces(ds, num_workers * list(range(num_elements)), assert_items_equal=True)


@not_applicable("tf.function: iterating a distributed dataset inside a traced function")
def testInsideFunction():
    """Ports DataServiceOpsTest.testInsideFunction."""


def testEmptyJobNameDistribute():
    """Ports DataServiceOpsTest.testEmptyJobNameDistribute."""
    cluster = TestCluster(num_workers=1)
    with pytest.raises(ValueError, match="`job_name` must not be empty"):
        Dataset.range(10).apply(
            sluice.distribute(
                processing_mode="parallel_epochs", service=cluster.dispatcher.target, job_name=""
            )
        )


def testEmptyJobNameFromDatasetId():
    """Ports DataServiceOpsTest.testEmptyJobNameFromDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset_id = sluice.register_dataset(cluster.dispatcher.target, Dataset.range(10))
    with pytest.raises(ValueError, match="`job_name` must not be empty"):
        sluice.from_dataset_id(
            dataset_id=dataset_id,
            processing_mode="parallel_epochs",
            service=cluster.dispatcher.target,
            job_name="",
        )


def testNonStringJobNameDistribute():
    """Ports DataServiceOpsTest.testNonStringJobNameDistribute (a numpy string array stands for
    tf.data's string tensor)."""
    cluster = TestCluster(num_workers=1)
    with pytest.raises(ValueError, match="`job_name` must be a string"):
        Dataset.range(10).apply(
            sluice.distribute(
                processing_mode="parallel_epochs",
                service=cluster.dispatcher.target,
                job_name=np.array("foo"),
            )
        )


def testNonStringJobNameFromDatasetId():
    """Ports DataServiceOpsTest.testNonStringJobNameFromDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset_id = sluice.register_dataset(cluster.dispatcher.target, Dataset.range(10))
    with pytest.raises(ValueError, match="`job_name` must be a string"):
        sluice.from_dataset_id(
            dataset_id=dataset_id,
            processing_mode="parallel_epochs",
            service=cluster.dispatcher.target,
            job_name=np.array("foo"),
        )


def testSharedJobName():
    """Ports DataServiceOpsTest.testSharedJobName."""
    cluster = TestCluster(num_workers=1)
    num_elements = 1000

    def make_ds():
        return Dataset.range(num_elements).shuffle(num_elements)

    ds1 = make_distributed_dataset(make_ds(), cluster, job_name="job_name")
    ds2 = make_distributed_dataset(make_ds(), cluster, job_name="job_name")
    get_next_1 = Next(ds1)
    get_next_2 = Next(ds2)
    results = []
    for _ in range(num_elements // 5):
        results.append(get_next_1())
        results.append(get_next_2())
    results += get_next_1.rest()
    results += get_next_2.rest()
    assert_count_equal(list(range(num_elements)), results)


def testDifferentJobNames():
    """Ports DataServiceOpsTest.testDifferentJobNames."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds1 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name1")
    ds2 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name2")
    assert_dataset_produces(ds1, list(range(num_elements)))
    assert_dataset_produces(ds2, list(range(num_elements)))


def testSharedJobNameMultiIteration():
    """Ports DataServiceOpsTest.testSharedJobNameMultiIteration."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds1 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name")
    ds2 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name")
    # iteration 1
    assert_dataset_produces(ds1, list(range(num_elements)))
    assert_dataset_produces(ds2, [])
    # iteration 2
    assert_dataset_produces(ds2, list(range(num_elements)))
    assert_dataset_produces(ds1, [])


def testSharedJobNameRepeat():
    """Ports DataServiceOpsTest.testSharedJobNameRepeat."""
    cluster = TestCluster(num_workers=1)
    num_elements = 100
    num_repetitions = 3
    ds1 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name")
    ds1 = ds1.repeat(num_repetitions)
    ds2 = make_distributed_range_dataset(num_elements, cluster, job_name="job_name")
    ds2 = ds2.repeat(num_repetitions)
    results = []
    get_next_1 = Next(ds1)
    get_next_2 = Next(ds2)
    for _ in range((num_elements * num_repetitions) // 5):
        results.append(get_next_1())
    for _ in range((num_elements * num_repetitions) // 5):
        results.append(get_next_2())
    results += get_next_1.rest()
    results += get_next_2.rest()
    assert_count_equal(num_repetitions * list(range(num_elements)), results)


def testSharedJobNameRepeatEmptyJob():
    """Ports DataServiceOpsTest.testSharedJobNameRepeatEmptyJob."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds = Dataset.range(num_elements)
    ds1 = ds.apply(
        sluice.distribute(
            sluice.ShardingPolicy.OFF, cluster.dispatcher_address(), job_name="shared_job"
        )
    )
    ds1 = ds1.repeat()
    ds2 = ds.apply(
        sluice.distribute(
            sluice.ShardingPolicy.OFF, cluster.dispatcher_address(), job_name="shared_job"
        )
    )
    ds2 = ds2.repeat()
    get_next_1 = Next(ds1)
    for i in list(range(num_elements)) * 3:
        assert py(get_next_1()) == i
    # Verifies ds2 is non-empty.
    get_next_2 = Next(ds2)
    for i in list(range(num_elements)) * 3:
        _ = get_next_2()


def testSharedJobNameMultipleEpochs():
    """Ports DataServiceOpsTest.testSharedJobNameMultipleEpochs."""
    cluster = TestCluster(num_workers=1)
    dataset = make_distributed_range_dataset(10, cluster, job_name="job_name")
    num_epochs = 5
    for _ in range(num_epochs):
        get_next = Next(dataset)
        assert [py(x) for x in get_next.rest()] == list(range(10))


def testStringDatasetId():
    """Ports DataServiceOpsTest.testStringDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.range(10)
    dataset_id = sluice.register_dataset(cluster.dispatcher.target, dataset)
    dataset_id_str = dataset_id if isinstance(dataset_id, str) else str(dataset_id)
    dataset = sluice.from_dataset_id(
        dataset_id=dataset_id_str,
        element_spec=dataset.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    assert_dataset_produces(dataset, list(range(10)))


def testPyStringDatasetId():
    """Ports DataServiceOpsTest.testPyStringDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.range(10)
    dataset_id = sluice.register_dataset(cluster.dispatcher.target, dataset)
    dataset_id_str = dataset_id.decode() if isinstance(dataset_id, bytes) else str(dataset_id)
    dataset = sluice.from_dataset_id(
        dataset_id=dataset_id_str,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    assert_dataset_produces(dataset, list(range(10)))


@pytest.mark.parametrize("job_name", [None, "test"])
def testGcUnusedJob(job_name):
    """Ports DataServiceOpsTest.testGcUnusedJob."""
    cluster = TestCluster(num_workers=1, job_gc_timeout_ms=20)
    num_elements = 100
    ds = make_distributed_range_dataset(num_elements, cluster, job_name=job_name)
    it = Next(ds)
    assert py(it()) == 0
    worker = cluster.workers[0].worker_address()
    assert cluster.num_tasks(worker) == 1
    it.release()
    wait_until(lambda: cluster.num_tasks(worker) == 0, "the unused job's task to be collected")


def testDontGcUsedJob():
    """Ports DataServiceOpsTest.testDontGcUsedJob."""
    cluster = TestCluster(num_workers=1, job_gc_timeout_ms=20)
    num_elements = 1000
    it1 = Next(make_distributed_range_dataset(num_elements, cluster, job_name="test1"))
    it2 = Next(make_distributed_range_dataset(num_elements, cluster, job_name="test2"))
    # This iterator keeps the task alive.
    it3 = Next(make_distributed_range_dataset(num_elements, cluster, job_name="test2"))
    worker = cluster.workers[0].worker_address()
    wait_until(lambda: cluster.num_tasks(worker) == 2, "both jobs' tasks")
    assert cluster.num_tasks(worker) == 2
    it1.release()
    it2.release()
    # Only the first job is collected: the second still has an iterator.
    wait_until(lambda: cluster.num_tasks(worker) <= 1, "the first job's task to be collected")
    time.sleep(0.2)  # past the GC timeout: the second job's task must still be there
    assert cluster.num_tasks(worker) == 1
    del it3


def testDontGcJobsWithVisitationGuarantees():
    """Ports DataServiceOpsTest.testDontGcJobsWithVisitationGuarantees."""
    cluster = TestCluster(num_workers=1, job_gc_timeout_ms=20)
    num_elements = 1000
    it1 = Next(make_distributed_range_dataset(num_elements, cluster, job_name="test1"))
    it2 = Next(
        make_distributed_range_dataset(
            num_elements,
            cluster,
            job_name="test2",
            processing_mode=sluice.ShardingPolicy.DYNAMIC,
        )
    )
    worker = cluster.workers[0].worker_address()
    wait_until(lambda: cluster.num_tasks(worker) == 2, "both jobs' tasks")
    it1.release()
    it2.release()
    # Only the first job is collected: the second has visitation guarantees.
    wait_until(lambda: cluster.num_tasks(worker) <= 1, "the first job's task to be collected")
    time.sleep(0.2)
    assert cluster.num_tasks(worker) == 1


def testGcAndRecreate():
    """Ports DataServiceOpsTest.testGcAndRecreate."""
    cluster = TestCluster(num_workers=3, job_gc_timeout_ms=20)
    num_elements = 1000
    # Repeatedly create and garbage-collect the same job.
    for _ in range(3):
        ds = make_distributed_range_dataset(num_elements, cluster, job_name="test")
        it = Next(ds)
        for _ in range(50):
            it()
        it.release()
        # Wait for the task to be garbage-collected on all workers.
        wait_until(lambda: cluster.num_tasks_on_workers() == 0, "every task to be collected")


@deliberate(
    "heartbeats are long polls: a reader's client heartbeats for as long as its iterator "
    "exists, so a client timeout never releases a live reader (tf.data's reader, refreshing "
    "every 10 s, is released after 50 ms)"
)
def testGcClient():
    """Ports DataServiceOpsTest.testGcClient."""
    dispatcher = sluice.DispatchServer(
        sluice.DispatcherConfig(job_gc_timeout_ms=20, client_timeout_ms=50)
    )
    worker = sluice.WorkerServer(
        sluice.WorkerConfig(dispatcher.target, heartbeat_interval_ms=100, python_executors=0)
    )
    try:
        dataset = Dataset.range(1000).apply(
            sluice.distribute(sluice.ShardingPolicy.OFF, dispatcher.target)
        )
        get_next = Next(dataset)
        with pytest.raises(errors.NotFoundError, match="Unknown iteration client id"):
            get_next()
            time.sleep(3)
            get_next.rest()
    finally:
        worker.stop()
        dispatcher.stop()


def testKeepClientAliveBeforeReading():
    """Ports DataServiceOpsTest.testKeepClientAliveBeforeReading."""
    dispatcher = sluice.DispatchServer(
        sluice.DispatcherConfig(job_gc_timeout_ms=20, client_timeout_ms=1000)
    )
    worker = sluice.WorkerServer(
        sluice.WorkerConfig(dispatcher.target, heartbeat_interval_ms=100, python_executors=0)
    )
    try:
        num_elements = 1000
        dataset = Dataset.range(num_elements).apply(
            sluice.distribute(sluice.ShardingPolicy.OFF, dispatcher.target)
        )
        get_next = Next(dataset)
        # The client heartbeats: it is not released though it reads nothing for 3 seconds.
        time.sleep(3)
        assert [py(x) for x in get_next.rest()] == list(range(num_elements))
    finally:
        worker.stop()
        dispatcher.stop()


@deliberate(
    "interleave keeps its deterministic order whatever Options.deterministic says: "
    "exactly-once delivery replays a failed worker's splits and needs the same order "
    "(docs/tfdata.md)"
)
def testApplyDeterminismOption():
    """Ports DataServiceOpsTest.testApplyDeterminismOption (tf.data's ``testing.sleep`` is a
    ``time.sleep`` in the interleaved function; ``checkDeterminism`` is inlined: with
    ``deterministic = False`` some run must produce another order than the input's)."""
    elements = list(range(10))
    cluster = TestCluster(num_workers=1, python_executors=1)

    def dataset_fn(delay_ms):
        def interleave_fn(x):
            if x == 0:
                time.sleep(delay_ms / 1000)
            return Dataset.from_tensors(x)

        ds = Dataset.from_tensor_slices(elements)
        ds = ds.interleave(interleave_fn, cycle_length=10, num_parallel_calls=10)
        opts = sluice.data.Options()
        opts.deterministic = False
        ds = ds.with_options(opts)
        return make_distributed_dataset(ds, cluster)

    # checkDeterminism(expect_determinism=False): with growing delays, an order differs.
    for delay_ms in [10, 100, 1000]:
        output = get_dataset_output(dataset_fn(delay_ms))
        assert sorted(output) == elements
        if output != elements:
            return
    raise AssertionError("the non-deterministic interleave kept the input order every time")


def _run_stateful(external_state_policy):
    num_elements = 10
    ds = Dataset.range(num_elements).map(lambda _: np.random.uniform())
    options = sluice.data.Options()
    options.experimental_external_state_policy = external_state_policy
    ds = ds.with_options(options)
    cluster = TestCluster(num_workers=3, python_executors=1)
    ds = make_distributed_dataset(ds, cluster)
    get_dataset_output(ds)


@pytest.mark.parametrize("external_state_policy", ["IGNORE", "WARN"])
def testStatefulNoError(external_state_policy):
    """Ports DataServiceOpsTest.testStatefulNoError."""
    _run_stateful(getattr(sluice.data.experimental.ExternalStatePolicy, external_state_policy))


def testStatefulError():
    """Ports DataServiceOpsTest.testStatefulError."""
    with pytest.raises(errors.FailedPreconditionError):
        _run_stateful(sluice.data.experimental.ExternalStatePolicy.FAIL)


@missing(
    "distribute inside an interleave function (the function captures a server), and "
    "distributing a dataset read from the service",
    raises=errors.InvalidArgumentError,
)
def testDistributeFromInterleave():
    """Ports DataServiceOpsTest.testDistributeFromInterleave."""
    cluster = TestCluster(num_workers=1)
    ds = Dataset.range(2)

    def interleave_fn(x):
        dataset = Dataset.range(10 * x, 10 * x + 2)
        return make_distributed_dataset(dataset, cluster)

    ds = ds.interleave(interleave_fn, cycle_length=2)
    assert_dataset_produces(ds, [0, 10, 1, 11])


def testDistributeNonStringAddresses():
    """Ports DataServiceOpsTest.testDistributeNonStringAddresses."""
    ds = Dataset.range(10)
    with pytest.raises(ValueError, match="`service` must be a string"):
        ds.apply(sluice.distribute(processing_mode="parallel_epochs", service=1))


def testDistributeEmptyAddress():
    """Ports DataServiceOpsTest.testDistributeEmptyAddress."""
    ds = Dataset.range(10)
    with pytest.raises(ValueError) as e:
        ds.apply(sluice.distribute(processing_mode="parallel_epochs", service=""))
    assert str(e.value) == "`service` must not be empty"


def testDistributeInvalidProtocol():
    """Ports DataServiceOpsTest.testDistributeInvalidProtocol."""
    cluster = TestCluster(num_workers=1)
    ds = Dataset.range(10)
    with pytest.raises(
        errors.NotFoundError, match="No credentials factory has been registered for protocol grp"
    ):
        ds = ds.apply(
            sluice.distribute(
                processing_mode="parallel_epochs",
                service="grp://" + cluster.dispatcher_address(),
            )
        )
        get_dataset_output(ds)


def testDistributeInvalidProcessingMode():
    """Ports DataServiceOpsTest.testDistributeInvalidProcessingMode."""
    ds = Dataset.range(10)
    with pytest.raises(
        ValueError,
        match=(
            "should be a `tf.data.experimental.service.ShardingPolicy`, "
            '`"parallel_epochs"`, or '
            "`\"distributed_epoch\"`. Got 'invalid'."
        ),
    ):
        ds.apply(sluice.distribute(processing_mode="invalid", service="grpc://localhost:5000"))


@missing("Dataset.zip of datasets read from the service", raises=errors.InvalidArgumentError)
def testZipDifferentProcessingModesDatasets():
    """Ports DataServiceOpsTest.testZipDifferentProcessingModesDatasets."""
    cluster = TestCluster(num_workers=1)
    num_elements = 100
    ds1 = make_distributed_dataset(
        Dataset.range(num_elements), cluster, processing_mode="distributed_epoch"
    )
    ds2 = make_distributed_dataset(
        Dataset.range(num_elements), cluster, processing_mode="parallel_epochs"
    )
    ds = Dataset.zip((ds1, ds2))
    assert_dataset_produces(
        ds, list(zip(range(num_elements), range(num_elements))), assert_items_equal=True
    )


@missing("Dataset.zip of datasets read from the service", raises=errors.InvalidArgumentError)
def testZipDifferentProcessingModesDatasetsSharedJobName():
    """Ports DataServiceOpsTest.testZipDifferentProcessingModesDatasetsSharedJobName."""
    cluster = TestCluster(num_workers=1)
    num_elements = 100
    ds1 = make_distributed_dataset(
        Dataset.range(num_elements),
        cluster,
        processing_mode="distributed_epoch",
        job_name="job_name",
    )
    ds2 = make_distributed_dataset(
        Dataset.range(num_elements),
        cluster,
        processing_mode="parallel_epochs",
        job_name="job_name",
    )
    ds = Dataset.zip((ds1, ds2))
    with pytest.raises(errors.InvalidArgumentError, match="but found an existing job with diff"):
        get_dataset_output(ds)


def testFromDatasetId():
    """Ports DataServiceOpsTest.testFromDatasetId."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds = Dataset.range(num_elements)
    dataset_id = sluice.register_dataset(cluster.dispatcher_address(), ds)
    from_dataset_id_ds = sluice.from_dataset_id(
        "parallel_epochs", cluster.dispatcher.target, dataset_id, ds.element_spec
    )
    assert_dataset_produces(from_dataset_id_ds, list(range(num_elements)))


@missing(
    "Dataset.interleave over a dataset of datasets",
    raises=(AttributeError, errors.InvalidArgumentError),
)
def testFromDatasetIdSharedJobs():
    """Ports DataServiceOpsTest.testFromDatasetIdSharedJobs."""
    cluster = TestCluster(num_workers=2)
    dataset_ids = ["dataset_1", "dataset_2"]
    datasets = [
        Dataset.range(20).map(lambda x: x.astype(np.int32)),
        Dataset.from_tensor_slices(list(range(20, 40))),
    ]
    for ds, dataset_id in zip(datasets, dataset_ids):
        sluice.register_dataset(cluster.dispatcher_address(), ds, dataset_id=dataset_id)
    # Read from both jobs in parallel, with 2 consumers for each job.
    data_service_datasets = []
    for _ in range(2):
        for dataset, dataset_id in zip(datasets, dataset_ids):
            ds = sluice.from_dataset_id(
                "distributed_epoch",
                cluster.dispatcher.target,
                dataset_id,
                dataset.element_spec,
                job_name="shared_job",
            )
            data_service_datasets.append(ds)
    ds = Dataset.from_tensor_slices(data_service_datasets)
    ds = ds.interleave(lambda x: x, cycle_length=len(data_service_datasets))
    assert_dataset_produces(ds, list(range(40)), assert_items_equal=True)


@not_applicable("tf.function: register_dataset traced with tensor arguments")
def testRegisteringDatasetAsTfFunction():
    """Ports DataServiceOpsTest.testRegisteringDatasetAsTfFunction."""


def testFromDatasetIdMultipleComponents():
    """Ports DataServiceOpsTest.testFromDatasetIdMultipleComponents."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds = Dataset.range(num_elements)
    ds = Dataset.zip({"a": (ds, ds), "b": ds})
    dataset_id = sluice.register_dataset(cluster.dispatcher_address(), ds)
    from_dataset_id_ds = sluice.from_dataset_id(
        "parallel_epochs", cluster.dispatcher.target, dataset_id, ds.element_spec
    )
    output = get_dataset_output(from_dataset_id_ds)
    for i in range(num_elements):
        assert i == output[i]["a"][0]
        assert i == output[i]["a"][1]
        assert i == output[i]["b"]


def testFromDatasetIdWrongElementSpec():
    """Ports DataServiceOpsTest.testFromDatasetIdWrongElementSpec (a string spec stands for
    tf.data's variant spec)."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds = Dataset.range(num_elements)
    dataset_id = sluice.register_dataset(cluster.dispatcher_address(), ds)
    wrong_spec = TensorSpec(shape=(), dtype=np.bytes_)
    with pytest.raises(Exception):
        from_dataset_id_ds = sluice.from_dataset_id(
            "parallel_epochs", cluster.dispatcher.target, dataset_id, wrong_spec
        )
        Next(from_dataset_id_ds)()


def testFromDatasetIdNotRegistered():
    """Ports DataServiceOpsTest.testFromDatasetIdNotRegistered."""
    cluster = TestCluster(num_workers=1)
    dataset_id = "UnregisteredID"
    element_spec = TensorSpec(shape=(), dtype=np.bytes_)
    with pytest.raises(errors.NotFoundError, match=f"Dataset id {dataset_id} not found."):
        from_dataset_id_ds = sluice.from_dataset_id(
            sluice.ShardingPolicy.OFF, cluster.dispatcher.target, dataset_id, element_spec
        )
        Next(from_dataset_id_ds)()


@not_applicable("skipped in TensorFlow's own suite (the test calls skipTest first)")
def testCancellation():
    """Ports DataServiceOpsTest.testCancellation: the first element comes at once, the second
    after 1000 s; the prefetch of the second must be cancelled when the iterator goes away."""
    sleep_seconds = 1000
    cluster = TestCluster(num_workers=1, python_executors=1)

    def slow_element(x):
        time.sleep(sleep_seconds)
        return x

    slow = Dataset.range(1).map(slow_element)
    ds = Dataset.range(1).concatenate(slow)
    ds = make_distributed_dataset(ds, cluster)
    ds = ds.prefetch(1)
    get_next = Next(ds)
    assert py(get_next()) == 0
    # Without cancellation, collecting the iterator hangs here.
    get_next.release()


def testRegisterDifferentDatasets():
    """Ports DataServiceOpsTest.testRegisterDifferentDatasets."""
    ds_1 = Dataset.range(10)
    ds_2 = Dataset.range(20)
    cluster = TestCluster(num_workers=1)
    id_1 = sluice.register_dataset(cluster.dispatcher_address(), ds_1)
    id_2 = sluice.register_dataset(cluster.dispatcher_address(), ds_2)
    assert id_1 != id_2


def testRegisterWithExplicitDatasetId():
    """Ports DataServiceOpsTest.testRegisterWithExplicitDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.range(10)
    dataset_id = sluice.register_dataset(
        cluster.dispatcher.target, dataset, dataset_id="dataset_id"
    )
    dataset = sluice.from_dataset_id(
        dataset_id=dataset_id,
        element_spec=dataset.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
    )
    assert_dataset_produces(dataset, list(range(10)))
    # Verifies the dataset ID is indeed "dataset_id".
    dataset = sluice.from_dataset_id(
        dataset_id="dataset_id",
        element_spec=dataset.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
    )
    assert_dataset_produces(dataset, list(range(10)))


def testFromRegisteredStringDatasetId():
    """Ports DataServiceOpsTest.testFromRegisteredStringDatasetId."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.range(10)
    _ = sluice.register_dataset(cluster.dispatcher.target, dataset, dataset_id="dataset_id")
    dataset = sluice.from_dataset_id(
        dataset_id="dataset_id",
        element_spec=dataset.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
    )
    assert_dataset_produces(dataset, list(range(10)))


def testRegisterSameDatasetIds():
    """Ports DataServiceOpsTest.testRegisterSameDatasetIds."""
    cluster = TestCluster(num_workers=1)
    dataset1 = Dataset.range(10)
    dataset2 = Dataset.range(10)
    dataset_id1 = sluice.register_dataset(
        cluster.dispatcher.target, dataset1, dataset_id="dataset_id"
    )
    dataset_id2 = sluice.register_dataset(
        cluster.dispatcher.target, dataset2, dataset_id="dataset_id"
    )
    dataset1 = sluice.from_dataset_id(
        dataset_id=dataset_id1,
        element_spec=dataset1.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    dataset2 = sluice.from_dataset_id(
        dataset_id=dataset_id2,
        element_spec=dataset2.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    # `dataset2` is empty: the datasets share the job and `dataset1` exhausted it.
    assert_dataset_produces(dataset1, list(range(10)))
    assert_dataset_produces(dataset2, [])


@pytest.mark.parametrize("different_dataset_id", [None, "another_dataset_id"])
def testRegisterDifferentDatasetIds(different_dataset_id):
    """Ports DataServiceOpsTest.testRegisterDifferentDatasetIds."""
    cluster = TestCluster(num_workers=1)
    dataset1 = Dataset.range(10)
    dataset2 = Dataset.range(10)
    dataset_id1 = sluice.register_dataset(
        cluster.dispatcher.target, dataset1, dataset_id="dataset_id"
    )
    dataset_id2 = sluice.register_dataset(
        cluster.dispatcher.target, dataset2, dataset_id=different_dataset_id
    )
    dataset1 = sluice.from_dataset_id(
        dataset_id=dataset_id1,
        element_spec=dataset1.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    dataset2 = sluice.from_dataset_id(
        dataset_id=dataset_id2,
        element_spec=dataset2.element_spec,
        processing_mode=sluice.ShardingPolicy.OFF,
        service=cluster.dispatcher.target,
        job_name="job_name",
    )
    # `dataset1` and `dataset2` are different datasets.
    assert_dataset_produces(dataset1, list(range(10)))
    assert_dataset_produces(dataset2, list(range(10)))


def testDatasetsDoNotMatch():
    """Ports DataServiceOpsTest.testDatasetsDoNotMatch."""
    cluster = TestCluster(num_workers=1)
    dataset1 = Dataset.range(10)
    dataset2 = Dataset.from_tensor_slices(list("Test dataset."))
    with pytest.raises(
        errors.InvalidArgumentError,
        match="Datasets with the same ID should have the same structure",
    ):
        dataset_id1 = sluice.register_dataset(
            cluster.dispatcher.target, dataset1, compression=None, dataset_id="dataset_id"
        )
        dataset_id2 = sluice.register_dataset(
            cluster.dispatcher.target, dataset2, compression=None, dataset_id="dataset_id"
        )
        dataset1 = sluice.from_dataset_id(
            dataset_id=dataset_id1,
            element_spec=dataset1.element_spec,
            processing_mode=sluice.ShardingPolicy.OFF,
            service=cluster.dispatcher.target,
        )
        dataset2 = sluice.from_dataset_id(
            dataset_id=dataset_id2,
            element_spec=dataset2.element_spec,
            processing_mode=sluice.ShardingPolicy.OFF,
            service=cluster.dispatcher.target,
        )
        get_dataset_output(dataset1)
        get_dataset_output(dataset2)


@missing(
    "distributing a dataset read from the service (a second distribute)",
    raises=errors.InvalidArgumentError,
)
def testDoubleDistribute():
    """Ports DataServiceOpsTest.testDoubleDistribute."""
    cluster = TestCluster(num_workers=1)
    ds = make_distributed_range_dataset(num_elements=10, cluster=cluster)
    ds = make_distributed_dataset(dataset=ds, cluster=cluster)
    assert_dataset_produces(ds, list(range(10)))


@missing(
    "distributing a dataset read from the service (a second distribute)",
    raises=errors.InvalidArgumentError,
)
def testTwoLevelDistribute():
    """Ports DataServiceOpsTest.testTwoLevelDistribute."""
    cluster_1_size = 3
    cluster_1 = TestCluster(num_workers=cluster_1_size)
    cluster_2 = TestCluster(num_workers=1, python_executors=1)
    num_sizes = 10
    size_repeats = 5
    strings = ["a" * i for i in range(num_sizes)] * size_repeats
    ds = Dataset.from_tensor_slices(strings)
    ds = ds.shuffle(len(strings))
    ds = make_distributed_dataset(ds, cluster_1)
    # Large enough so that all strings of the same size are windowed together.
    window_size = cluster_1_size * size_repeats
    batch_size = size_repeats

    def key_func(x):
        return np.int64(len(x))

    ds = ds.group_by_window(
        key_func=key_func, reduce_func=lambda _, x: x.batch(batch_size), window_size=window_size
    )
    ds = make_distributed_dataset(ds, cluster_2)
    get_next = Next(ds)
    for _ in range(num_sizes):
        element = py(get_next())
        for _ in range(1, cluster_1_size):
            assert py(get_next()) == element
    assert get_next.rest() == []


def testDistributeLargeGraph():
    """Ports DataServiceOpsTest.testDistributeLargeGraph."""
    cluster = TestCluster(num_workers=1, work_dir=NO_WORK_DIR, fault_tolerant_mode=False)
    # Larger than gRPC's default message size limit of 4 MB.
    tensor = np.ones((2, 1000, 1000), dtype=np.float32)
    ds = Dataset.from_tensors(tensor)
    ds = make_distributed_dataset(ds, cluster)
    output = get_dataset_output(ds)
    assert len(output) == 1
    np.testing.assert_array_equal(np.array(output[0]), tensor)


def testBatchDropsAllElements():
    """Ports DataServiceOpsTest.testBatchDropsAllElements."""
    cluster = TestCluster(num_workers=2, fault_tolerant_mode=False)
    dataset = Dataset.range(10).batch(1000, drop_remainder=True)
    dataset = make_distributed_dataset(dataset, cluster, processing_mode=sluice.ShardingPolicy.OFF)
    assert_dataset_produces(dataset, [])


def testBatchDoesNotDropRemainder():
    """Ports DataServiceOpsTest.testBatchDoesNotDropRemainder."""
    num_workers = 2
    cluster = TestCluster(num_workers=num_workers, fault_tolerant_mode=False)
    dataset = Dataset.range(10).batch(1000, drop_remainder=False)
    dataset = make_distributed_dataset(dataset, cluster, processing_mode=sluice.ShardingPolicy.OFF)
    assert_dataset_produces(dataset, [list(range(10))] * num_workers)


@pytest.mark.parametrize(
    "use_resource",
    [
        pytest.param(
            False,
            marks=not_applicable("graph mode: TF1 reference variables (use_resource=False)"),
        ),
        True,
    ],
)
def testVariables(use_resource):
    """Ports DataServiceOpsTest.testVariables (the variable is a Python value the function
    closes over)."""
    cluster = TestCluster(num_workers=1, python_executors=1)
    v = np.int64(10)
    ds = Dataset.range(3)
    ds = ds.map(lambda x: x + v)
    ds = make_distributed_dataset(ds, cluster)
    assert_dataset_produces(ds, list(range(10, 13)))


def testNoShardingPolicy():
    """Ports DataServiceOpsTest.testNoShardingPolicy."""
    cluster = TestCluster(num_workers=1)
    dataset = Dataset.range(20)
    dataset = make_distributed_dataset(
        dataset, cluster=cluster, processing_mode=sluice.ShardingPolicy.OFF
    )
    assert_dataset_produces(dataset, list(range(20)))


def testExplicitProtocolFromDatasetId():
    """Ports DataServiceOpsGrpcDataTransferTest.testExplicitProtocolFromDatasetId."""
    cluster = TestCluster(num_workers=1)
    range_ds = Dataset.range(10)
    dataset_id = sluice.register_dataset(cluster.dispatcher.target, range_ds)
    ds = sluice.from_dataset_id(
        dataset_id=dataset_id,
        processing_mode="parallel_epochs",
        element_spec=range_ds.element_spec,
        service=cluster.dispatcher.target,
        data_transfer_protocol="grpc",
    )
    assert_dataset_produces(ds, list(range(10)))


def testDistributeExplicitProtocol():
    """Ports DataServiceOpsGrpcDataTransferTest.testDistributeExplicitProtocol."""
    cluster = TestCluster(num_workers=1)
    ds = Dataset.range(10)
    ds = ds.apply(
        sluice.distribute(
            processing_mode="parallel_epochs", service="grpc://" + cluster.dispatcher_address()
        )
    )
    assert_dataset_produces(ds, list(range(10)))


@pytest.mark.parametrize("compression", [None, "AUTO"])
def testDistributeCompression(compression):
    """Ports DataServiceOpsGrpcDataTransferTest.testDistributeCompression."""
    cluster = TestCluster(num_workers=1)
    num_elements = 10
    ds = make_distributed_range_dataset(num_elements, cluster, compression=compression)
    assert_dataset_produces(ds, list(range(num_elements)))
