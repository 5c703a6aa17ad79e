"""A worker's credentials from Python: the exposure rule, a token file, and readers that present
their token from the environment (tf.data's functions have no argument for it)."""

from __future__ import annotations

import pytest

import sluice
from sluice import errors
from sluice.data import Dataset

CLIENT_TOKEN = "client-token-0123456789abcdef"
WORKER_TOKEN = "worker-token-0123456789abcdef"


def ints(ds) -> list:  # type: ignore[no-untyped-def]
    return sorted(int(x) for x in ds)


def test_a_worker_beyond_loopback_needs_tls_and_a_token_or_insecure(no_credentials_in_env):
    with sluice.DispatchServer() as dispatcher:
        with pytest.raises(errors.FailedPreconditionError) as e:
            sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target, host="0.0.0.0"))
        assert "refusing to serve the worker port on 0.0.0.0:" in str(e.value)
        assert "--insecure" in str(e.value)
        config = sluice.WorkerConfig(
            dispatcher.target, host="0.0.0.0", insecure=True, worker_address="127.0.0.1:%port%"
        )
        with sluice.WorkerServer(config) as worker:
            assert worker.address.startswith("127.0.0.1:")


def test_readers_present_the_token_of_their_environment(tmp_path, no_credentials_in_env):
    tokens = tmp_path / "worker.tokens"
    tokens.write_text(f"worker w1 {WORKER_TOKEN}\nclient trainers {CLIENT_TOKEN}\n")
    with sluice.DispatchServer() as dispatcher:
        config = sluice.WorkerConfig(dispatcher.target, auth_token_file=tokens)
        with sluice.WorkerServer(config):
            no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN", CLIENT_TOKEN)
            ds = Dataset.range(5).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            assert ints(ds) == [0, 1, 2, 3, 4]

            no_credentials_in_env.delenv("SLUICE_AUTH_TOKEN")
            ds = Dataset.range(5).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            with pytest.raises(errors.UnauthenticatedError) as e:
                ints(ds)
            assert "no credentials" in str(e.value)

            no_credentials_in_env.setenv("SLUICE_AUTH_TOKEN", WORKER_TOKEN)
            ds = Dataset.range(5).apply(sluice.distribute("parallel_epochs", dispatcher.target))
            with pytest.raises(errors.PermissionDeniedError) as e:
                ints(ds)
            assert "may not call Fetch" in str(e.value)


def test_a_bad_token_file_is_an_invalid_argument(tmp_path, no_credentials_in_env):
    tokens = tmp_path / "short.tokens"
    tokens.write_text("short\n")
    with sluice.DispatchServer() as dispatcher:
        with pytest.raises(errors.InvalidArgumentError) as e:
            sluice.WorkerServer(sluice.WorkerConfig(dispatcher.target, auth_token_file=tokens))
        assert "at least 16 characters" in str(e.value)
