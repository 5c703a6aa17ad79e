"""A cluster with TLS and tokens on every link, from Python: credentials made with
``sluice.make_credentials``, servers configured with them, a trainer that presents the CA and its
token through the environment (tf.data's API has no argument for them), and the refusals a
trainer without them meets."""

from __future__ import annotations

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset


@pytest.fixture
def secure(tmp_path):  # type: ignore[no-untyped-def]
    certs = tmp_path / "certs"
    sluice.make_credentials(certs)
    dispatcher = sluice.DispatchServer(
        sluice.DispatcherConfig(
            tls_cert=certs / "dispatcher.pem",
            tls_key=certs / "dispatcher.key",
            tls_ca=certs / "ca.pem",
            auth_token_file=certs / "tokens",
        )
    )
    worker = sluice.WorkerServer(
        sluice.WorkerConfig(
            dispatcher.target,
            tls_cert=certs / "worker.pem",
            tls_key=certs / "worker.key",
            tls_ca=certs / "ca.pem",
            auth_token_file=certs / "worker.tokens",
        )
    )
    yield certs, dispatcher
    worker.stop()
    dispatcher.stop()


def test_a_trainer_with_the_ca_and_its_token_reads_exactly_once(secure, no_credentials_in_env):  # type: ignore[no-untyped-def]
    certs, dispatcher = secure
    no_credentials_in_env.setenv("SLUICE_TLS_CA", str(certs / "ca.pem"))
    no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN_FILE", str(certs / "client.token"))
    ds = Dataset.range(100).apply(sluice.distribute("distributed_epoch", dispatcher.target))
    assert sorted(int(x) for x in ds) == list(range(100))


def test_a_trainer_without_credentials_is_told_what_it_lacks(secure, no_credentials_in_env):  # type: ignore[no-untyped-def]
    certs, dispatcher = secure
    no_credentials_in_env.setenv("SLUICE_TLS_CA", str(certs / "ca.pem"))
    with pytest.raises(errors.UnauthenticatedError) as e:
        list(Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target)))
    assert "no credentials" in str(e.value)


def test_a_trainers_token_may_not_change_the_quorum(secure, no_credentials_in_env):  # type: ignore[no-untyped-def]
    certs, dispatcher = secure
    no_credentials_in_env.setenv("SLUICE_TLS_CA", str(certs / "ca.pem"))
    no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN_FILE", str(certs / "client.token"))
    with pytest.raises(errors.PermissionDeniedError) as e:
        sluice.remove_node(dispatcher.target, 7)
    assert "needs the admin role" in str(e.value)
    # The cluster's token file presents its admin line for membership changes (node 7 is no
    # member, which is the answer: the voters stay as they are).
    no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN_FILE", str(certs / "tokens"))
    with pytest.raises(errors.NotFoundError) as e:
        sluice.remove_node(dispatcher.target, 7)
    assert "node 7 is not a member (voters {1}" in str(e.value)


def test_a_trainer_without_the_ca_is_told_the_dispatcher_speaks_tls(secure, no_credentials_in_env):  # type: ignore[no-untyped-def]
    certs, dispatcher = secure
    no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN_FILE", str(certs / "client.token"))
    with pytest.raises(errors.FailedPreconditionError) as e:
        list(Dataset.range(3).apply(sluice.distribute("parallel_epochs", dispatcher.target)))
    assert "speaks TLS" in str(e.value) and "SLUICE_TLS_CA" in str(e.value)


def test_a_trainer_refuses_a_dispatcher_with_a_worker_certificate(tmp_path, no_credentials_in_env):  # type: ignore[no-untyped-def]
    certs = tmp_path / "certs"
    sluice.make_credentials(certs)
    impostor = sluice.DispatchServer(
        sluice.DispatcherConfig(
            tls_cert=certs / "worker.pem",
            tls_key=certs / "worker.key",
            tls_ca=certs / "ca.pem",
            auth_token_file=certs / "tokens",
        )
    )
    try:
        no_credentials_in_env.setenv("SLUICE_TLS_CA", str(certs / "ca.pem"))
        no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN_FILE", str(certs / "client.token"))
        with pytest.raises(errors.FailedPreconditionError) as e:
            list(Dataset.range(3).apply(sluice.distribute("parallel_epochs", impostor.target)))
        assert "not a dispatcher's" in str(e.value)
    finally:
        impostor.stop()


def test_a_replica_beyond_loopback_needs_tls_and_a_token_or_insecure(no_credentials_in_env):  # type: ignore[no-untyped-def]
    with pytest.raises(errors.FailedPreconditionError) as e:
        sluice.DispatchServer(sluice.DispatcherConfig(host="0.0.0.0"))
    assert "without TLS and authentication" in str(e.value)
    with sluice.DispatchServer(sluice.DispatcherConfig(host="0.0.0.0", insecure=True)) as d:
        assert d.target.startswith("grpc://0.0.0.0:")


def test_credentials_are_never_overwritten(tmp_path):  # type: ignore[no-untyped-def]
    sluice.make_credentials(tmp_path / "certs")
    with pytest.raises(errors.FailedPreconditionError) as e:
        sluice.make_credentials(tmp_path / "certs")
    assert "ca.pem" in str(e.value)
