"""Every error class Sluice raises, with tf.data's text, under one base class."""

from __future__ import annotations

import numpy as np
import pytest

import sluice
from sluice import errors
from sluice.data import Dataset, TextLineDataset, TFRecordDataset

TF_CLASSES = [
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
]


def test_every_class_is_an_op_error_named_as_tf_errors():
    assert errors.SluiceError is errors.OpError
    for name in TF_CLASSES:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.OpError) and cls is not errors.OpError
        e = cls("text")
        assert e.message == "text" and str(e) == "text"
        assert repr(e) == f"{name}('text')"


def test_invalid_argument_unknown_processing_mode():
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).apply(sluice.distribute("sideways", "127.0.0.1:1"))
    assert str(e.value) == (
        "tf.data service processing mode should be a "
        '`tf.data.experimental.service.ShardingPolicy`, `"parallel_epochs"`, or '
        "`\"distributed_epoch\"`. Got 'sideways'."
    )


def test_invalid_argument_consumer_index_without_num_consumers(cluster):
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).apply(
            sluice.distribute("parallel_epochs", cluster.target, job_name="j", consumer_index=0)
        )
    assert str(e.value) == "Must either set both `consumer_index` and `num_consumers`, or neither."


def test_invalid_argument_num_consumers_without_job_name(cluster):
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).apply(
            sluice.distribute("parallel_epochs", cluster.target, consumer_index=0, num_consumers=2)
        )
    assert str(e.value) == (
        "`job_name` must be set when setting `num_consumers`. num_consumers was set to 2."
    )


def test_invalid_argument_unknown_function(cluster):
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).map("no_such_fn").apply(
            sluice.distribute("parallel_epochs", cluster.target)
        )
    assert str(e.value).startswith("unknown function 'no_such_fn' in map")


def test_invalid_argument_a_different_dataset_under_a_taken_id(cluster):
    sluice.register_dataset(cluster.target, Dataset.range(6), dataset_id="taken")
    with pytest.raises(errors.InvalidArgumentError):
        sluice.register_dataset(cluster.target, Dataset.range(7), dataset_id="taken")


def test_invalid_argument_a_map_of_neither_a_callable_nor_a_name():
    with pytest.raises(errors.InvalidArgumentError, match="callable or the name of a built-in"):
        Dataset.range(3).map(3)  # type: ignore[arg-type]


def test_invalid_argument_compression_and_target_workers(cluster):
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).apply(
            sluice.distribute("parallel_epochs", cluster.target, compression="zip")
        )
    assert str(e.value) == "Invalid `compression` argument: zip. Must be one of ['auto', 'none']."
    assert isinstance(e.value, ValueError)  # tf.data's class
    with pytest.raises(errors.InvalidArgumentError) as e:
        Dataset.range(3).apply(
            sluice.distribute("parallel_epochs", cluster.target, target_workers="nearby")
        )
    assert str(e.value) == "Unrecognized target workers: NEARBY"


def test_not_found_unknown_dataset_id(cluster):
    with pytest.raises(errors.NotFoundError) as e:
        sluice.from_dataset_id("parallel_epochs", cluster.target, "nope")
    assert str(e.value) == (
        "Dataset id nope not found. It must be registered with `register_dataset` before "
        "calling `from_dataset_id`."
    )


def test_failed_precondition_worker_not_in_the_worker_list():
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(worker_addresses=["10.255.255.1:1"]))
    try:
        with pytest.raises(errors.FailedPreconditionError) as e:
            sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target))
        assert "Failed to assign an index for worker 127.0.0.1:" in str(e.value)
    finally:
        dispatcher.stop()


def test_a_server_that_cannot_start_raises_its_class_which_is_also_a_runtime_error():
    """tf.data raises RuntimeError for a server that cannot start; Sluice's class stays."""
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(worker_addresses=["10.255.255.1:1"]))
    try:
        with pytest.raises(RuntimeError) as e:
            sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target))
        assert isinstance(e.value, errors.FailedPreconditionError)
        assert type(e.value).__name__ == "FailedPreconditionError"
        with pytest.raises(RuntimeError, match="Worker tags cannot be empty."):
            sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target, worker_tags=[""]))
    finally:
        dispatcher.stop()


def test_invalid_argument_a_definition_over_max_definition_size():
    dispatcher = sluice.DispatchServer(sluice.DispatcherConfig(max_definition_size=1000))
    try:
        with pytest.raises(errors.InvalidArgumentError) as e:
            sluice.register_dataset(
                dispatcher.target, Dataset.from_tensor_slices(np.zeros(1000, np.int64))
            )
        assert "over this dispatcher's limit of 1000 bytes (--max-definition-size)" in str(e.value)
        sluice.register_dataset(dispatcher.target, Dataset.range(10))
    finally:
        dispatcher.stop()


def test_unavailable_a_port_in_use(cluster):
    port = int(cluster.workers[0].address.rsplit(":", 1)[1])
    with pytest.raises(errors.UnavailableError) as e:
        sluice.WorkerServer(sluice.WorkerConfig(cluster.target, port=port))
    assert str(e.value).startswith(f"bind 127.0.0.1:{port}: ")


def test_data_loss_a_corrupt_tfrecord(tmp_path):
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00garbage-that-is-no-record")
    with pytest.raises(errors.DataLossError) as e:
        list(TFRecordDataset(str(path)))
    assert str(e.value).startswith(f"corrupt record in '{path}' at byte offset 0")


def test_missing_files(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="to match at least one file"):
        Dataset.list_files(str(tmp_path / "*.none"))
    with pytest.raises(errors.InvalidArgumentError) as e:
        list(TextLineDataset(str(tmp_path / "*.none")))
    assert str(e.value) == f"no files match pattern '{tmp_path / '*.none'}'"
    missing = tmp_path / "missing.txt"
    with pytest.raises(errors.NotFoundError) as e:
        list(TextLineDataset([str(missing)]))
    assert str(e.value) == f"cannot read '{missing}': no such file or directory (os error 2)"


def test_unsupported_dtypes_are_refused():
    with pytest.raises(errors.InvalidArgumentError, match="unsupported dtype float16"):
        Dataset.from_tensor_slices(np.zeros(3, np.float16))


def test_local_errors_keep_their_class():
    with pytest.raises(errors.InvalidArgumentError) as e:
        list(Dataset.range(3).map("no_such_fn"))
    assert "unknown function 'no_such_fn' in map" in str(e.value)
    with pytest.raises(errors.InvalidArgumentError):
        Dataset.range(3).shard(2, 5)


def test_no_bare_exceptions_for_bad_arguments():
    with pytest.raises(errors.OpError):
        Dataset.from_tensor_slices(3)  # a scalar has no slices
    with pytest.raises(errors.OpError):
        Dataset.from_tensor_slices(({"a": [1]}, [1, 2]))  # slices of different lengths
    with pytest.raises(errors.OpError):
        sluice.DispatchServer(sluice.DispatcherConfig(protocol="http"))


# tf.data rejects these arguments in Python with `ValueError`, and code written for it catches
# that: Sluice's error is both a `ValueError` and an `InvalidArgumentError`, with tf.data's text.
@pytest.mark.parametrize(
    "call, text",
    [
        (
            lambda: sluice.distribute("parallel_epochs", "127.0.0.1:1", job_name=3),
            "`job_name` must be a string, but `job_name` was of type <class 'int'>. job_name=3",
        ),
        (
            lambda: sluice.distribute("parallel_epochs", "127.0.0.1:1", job_name=""),
            "`job_name` must not be empty",
        ),
        (
            lambda: sluice.from_dataset_id("parallel_epochs", "127.0.0.1:1", "7", job_name=3),
            "`job_name` must be a string, but `job_name` was of type <class 'int'>. job_name=3",
        ),
        (
            lambda: sluice.distribute("parallel_epochs", "127.0.0.1:1", num_consumers=2),
            "`job_name` must be set when setting `num_consumers`. num_consumers was set to 2.",
        ),
        (
            lambda: sluice.distribute("invalid", "127.0.0.1:1"),
            "tf.data service processing mode should be a "
            '`tf.data.experimental.service.ShardingPolicy`, `"parallel_epochs"`, or '
            "`\"distributed_epoch\"`. Got 'invalid'.",
        ),
        (
            lambda: sluice.distribute("parallel_epochs", 5050),
            "`service` must be a string, but `service` was of type <class 'int'>. service=5050",
        ),
        (
            lambda: sluice.distribute("parallel_epochs", ""),
            "`service` must not be empty",
        ),
        (
            lambda: sluice.distribute("parallel_epochs", "grpc://grpc://h:1"),
            "Malformed `service` string has multiple '://': grpc://grpc://h:1.",
        ),
        (
            lambda: sluice.CrossTrainerCache(trainer_id=None),
            "tf.data service cross-trainer cache requires a non-empty trainer ID.",
        ),
        (
            lambda: sluice.CrossTrainerCache(trainer_id=""),
            "tf.data service cross-trainer cache requires a non-empty trainer ID.",
        ),
    ],
)
def test_python_argument_errors_are_value_errors_with_tf_datas_text(call, text):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as e:
        call()
    assert isinstance(e.value, errors.InvalidArgumentError)
    assert str(e.value) == text


def test_worker_errors_keep_their_class_a_file_missing_on_the_worker_is_not_found(cluster, tmp_path):  # type: ignore[no-untyped-def]
    """A pipeline that fails on a worker fails the reader with the failure's own class, its
    text prefixed with the worker's address, as tf.data keeps a worker error's code."""
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    ds = TextLineDataset([str(path)]).apply(sluice.distribute("parallel_epochs", cluster.target))
    path.unlink()  # after registration, which checks that it exists
    with pytest.raises(errors.NotFoundError) as e:
        list(ds)
    assert str(e.value).startswith("Failed to get element from worker 127.0.0.1:")
    assert f"cannot read '{path}'" in str(e.value)


def test_worker_errors_keep_their_class_a_corrupt_record_is_data_loss(cluster, tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00garbage-that-is-no-record")
    ds = TFRecordDataset(str(path)).apply(sluice.distribute("parallel_epochs", cluster.target))
    with pytest.raises(errors.DataLossError) as e:
        list(ds)
    assert str(e.value).startswith("Failed to get element from worker 127.0.0.1:")


def test_worker_errors_keep_their_class_static_sharding_without_a_worker_list_is_not_found(
    cluster,
):  # type: ignore[no-untyped-def]
    ds = Dataset.range(20).apply(sluice.distribute(sluice.ShardingPolicy.FILE_OR_DATA, cluster.target))
    with pytest.raises(errors.NotFoundError, match="Worker .* is not in the workers list."):
        list(ds)


def test_worker_errors_keep_their_class_file_sharding_of_a_range_is_not_found(tmp_path):  # type: ignore[no-untyped-def]
    from conftest import start_cluster, stop_cluster

    c = start_cluster(2, worker_addresses=["127.0.0.1", "127.0.0.1"])
    try:
        ds = Dataset.range(20).apply(sluice.distribute(sluice.ShardingPolicy.FILE, c.target))
        with pytest.raises(errors.NotFoundError, match="Found an unshardable source dataset"):
            list(ds)
    finally:
        stop_cluster(c)


def test_file_sources_take_bytes_and_path_file_names(tmp_path):  # type: ignore[no-untyped-def]
    """A file name may be bytes (what a function over ``list_files`` receives), a path or a numpy
    scalar, as tf.data takes them; each names the file, not a list of its characters."""
    import pathlib

    path = tmp_path / "a.txt"
    path.write_text("x\ny\n")
    for name in (str(path), bytes(path), pathlib.Path(path), np.bytes_(bytes(path)), [bytes(path)]):
        assert [bytes(v) for v in TextLineDataset(name)] == [b"x", b"y"], name
    files = Dataset.list_files(str(tmp_path / "*.txt"))
    assert [bytes(v) for v in files.flat_map(TextLineDataset)] == [b"x", b"y"]
