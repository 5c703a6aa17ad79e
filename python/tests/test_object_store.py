"""Files datasets read from an S3-compatible store: moto's server (``moto[server]``, which
scripts/test installs; without it this module fails to import, it does not skip) on a free
loopback port, configured through the environment as a deployment would be."""

from __future__ import annotations

import json
import os
import uuid

import boto3
import pytest
from moto.server import ThreadedMotoServer

import sluice
from sluice import _native, errors
from sluice.data import Dataset, TextLineDataset, TFRecordDataset

from conftest import start_cluster, stop_cluster

SECRET = "python-testing-secret"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A new bucket on a moto server, with the endpoint and credentials in the environment;
    yields the bucket's name."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT": f"http://{host}:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "python-testing-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        # A bucket name of its own: the clients are kept per bucket for the process's life.
        name = f"sluice-py-{uuid.uuid4().hex[:12]}"
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT"],
            region_name="us-east-1",
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=SECRET,
        )
        s3.create_bucket(Bucket=name)
        _write_parts(name, s3, str(tmp_path_factory.mktemp("parts")))
        yield name
    server.stop()


def _records(f: int) -> list:
    return [f"file{f}-record{r}".encode() for r in range(20)]


def _write_parts(bucket: str, s3, tmp_dir: str) -> None:
    """Four TFRecord objects below ``data/`` (written by sluice's writer, uploaded by boto3),
    a text object, and objects a ``data/*.tfrecord`` pattern must not match."""
    for f in range(4):
        path = os.path.join(tmp_dir, f"part-{f}.tfrecord")
        writer = _native.TfRecordWriter(path)
        for r in _records(f):
            writer.write(r)
        writer.close()
        with open(path, "rb") as fh:
            s3.put_object(Bucket=bucket, Key=f"data/part-{f}.tfrecord", Body=fh.read())
    s3.put_object(Bucket=bucket, Key="data/lines.txt", Body=b"one\ntwo\n")
    s3.put_object(Bucket=bucket, Key="data/sub/part-9.tfrecord", Body=b"")
    s3.put_object(Bucket=bucket, Key="other/part-0.tfrecord", Body=b"")


def _all_records() -> list:
    return [r for f in range(4) for r in _records(f)]


def test_a_tfrecord_glob_in_a_bucket_reads_in_this_process(bucket):
    ds = TFRecordDataset(f"s3://{bucket}/data/*.tfrecord")
    assert list(ds) == _all_records()
    assert list(TextLineDataset(f"s3://{bucket}/data/lines.txt")) == [b"one", b"two"]


def test_list_files_lists_objects_by_the_same_glob_rules(bucket):
    names = Dataset.list_files(f"s3://{bucket}/data/*.tfrecord", shuffle=False)
    want = [f"s3://{bucket}/data/part-{f}.tfrecord".encode() for f in range(4)]
    assert list(names) == want
    assert list(TFRecordDataset(names)) == _all_records()
    with pytest.raises(errors.InvalidArgumentError):
        Dataset.list_files(f"s3://{bucket}/data/*.nothing")


def test_servers_read_objects_below_their_url_roots(bucket):
    cluster = start_cluster(2, data_roots=[f"s3://{bucket}/data"])
    try:
        ds = TFRecordDataset(f"s3://{bucket}/data/*.tfrecord")
        got = list(ds.apply(sluice.distribute("parallel_epochs", cluster.target)))
        assert sorted(got) == sorted(_all_records() * 2)
        got = list(ds.apply(sluice.distribute("distributed_epoch", cluster.target)))
        assert sorted(got) == sorted(_all_records())
        outside = f"s3://{bucket}/other/part-0.tfrecord"
        with pytest.raises(errors.PermissionDeniedError) as e:
            list(
                TFRecordDataset(outside).apply(
                    sluice.distribute("parallel_epochs", cluster.target)
                )
            )
        message = str(e.value)
        assert f"refused to read '{outside}': outside the data roots" in message, message
    finally:
        stop_cluster(cluster)


def test_a_missing_object_is_an_error_naming_its_url_and_no_secret(bucket):
    url = f"s3://{bucket}/data/missing.tfrecord"
    with pytest.raises(errors.OpError) as e:
        list(TFRecordDataset([url]))
    message = str(e.value)
    assert f"cannot read '{url}': no such object" in message, message
    assert SECRET not in message, message


def test_objects_read_ahead_keep_their_order_and_a_missing_one_fails_at_its_turn(bucket):
    """The next objects are requested while one is read: the records still come in the files'
    order, and a missing object's error comes after the records of the files before it."""
    part = lambda f: f"s3://{bucket}/data/part-{f}.tfrecord"  # noqa: E731
    order = [3, 1, 0, 2]
    want = [r for f in order for r in _records(f)]
    assert list(TFRecordDataset([part(f) for f in order])) == want
    missing = f"s3://{bucket}/data/missing.tfrecord"
    got = []
    with pytest.raises(errors.OpError) as e:
        for record in TFRecordDataset([part(3), part(1), missing, part(0), part(2)]):
            got.append(record)
    assert got == _records(3) + _records(1)
    message = str(e.value)
    assert f"cannot read '{missing}': no such object" in message, message

def test_object_store_config_gives_the_servers_the_store_and_no_secret_shows(
    tmp_path, monkeypatch
):
    """A bucket whose endpoint and credentials are only in the settings file the dispatcher and
    the workers are given (``object_store_config``): nothing of them in the environment. The
    servers run in this process, whose settings they become, so the client (which lists the
    pattern itself) reads the store with them too."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        name = f"sluice-cfg-{uuid.uuid4().hex[:12]}"
        secret = f"config-only-secret-{uuid.uuid4().hex[:8]}"
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="config-key",
            aws_secret_access_key=secret,
        )
        s3.create_bucket(Bucket=name)
        _write_parts(name, s3, str(tmp_path))
        for var in list(os.environ):
            if var.startswith("AWS_"):
                monkeypatch.delenv(var)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        pattern = f"s3://{name}/data/*.tfrecord"
        # Without the settings this process has no way to the store.
        with pytest.raises(errors.PermissionDeniedError) as e:
            list(TFRecordDataset(pattern))
        assert "no AWS credentials" in str(e.value), str(e.value)

        (tmp_path / "s3-secret").write_text(secret + "\n")
        config = tmp_path / "object-stores.json"
        config.write_text(
            json.dumps(
                {
                    "stores": {
                        f"s3://{name}": {
                            "endpoint": endpoint,
                            "allow_http": True,
                            "region": "us-east-1",
                            "access_key_id": "config-key",
                            "secret_access_key": {"file": "s3-secret"},
                        }
                    }
                }
            )
        )
        roots = [f"s3://{name}/data"]
        dispatcher = sluice.DispatchServer(
            sluice.DispatcherConfig(data_roots=roots, object_store_config=str(config))
        )
        workers = [
            sluice.WorkerServer(
                sluice.WorkerConfig(
                    dispatcher.target, data_roots=roots, object_store_config=config
                )
            )
            for _ in range(2)
        ]
        try:
            ds = TFRecordDataset(pattern)
            got = list(ds.apply(sluice.distribute("distributed_epoch", dispatcher.target)))
            assert sorted(got) == sorted(_all_records())
            # The status page's document (`/status.json`), read through the client API.
            status = dispatcher.status()
            assert status["members"], status
            assert secret not in json.dumps(status), status
            missing = f"s3://{name}/data/missing.tfrecord"
            with pytest.raises(errors.OpError) as e:
                list(
                    TFRecordDataset(missing).apply(
                        sluice.distribute("parallel_epochs", dispatcher.target)
                    )
                )
            assert secret not in str(e.value), str(e.value)
        finally:
            for s in workers + [dispatcher]:
                s.stop()
    finally:
        server.stop()
