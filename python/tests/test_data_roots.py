"""Servers read files only below their data roots: none by default, with a message saying so;
the user's own process reads any file."""

from __future__ import annotations

import os

import pytest

import sluice
from sluice import errors
from sluice.data import TextLineDataset

from conftest import start_cluster, stop_cluster


def _distributed(path: str, target: str) -> list:
    return list(TextLineDataset(path).apply(sluice.distribute("parallel_epochs", target)))


def test_servers_without_data_roots_refuse_files_and_say_how_to_allow_them(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n")
    cluster = start_cluster(1)
    try:
        with pytest.raises(errors.PermissionDeniedError) as e:
            _distributed(str(path), cluster.target)
        message = str(e.value)
        assert f"refused to read '{path}': this server has no data roots" in message, message
        assert "data_roots=[...] in Python" in message, message
    finally:
        stop_cluster(cluster)
    # The user's own process reads it.
    assert list(TextLineDataset(str(path))) == [b"one", b"two"]


def test_servers_with_data_roots_read_below_them_and_refuse_outside(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("one\ntwo\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    os.symlink(secret, root / "link.txt")
    cluster = start_cluster(1, data_roots=[str(root)])
    try:
        assert _distributed(str(root / "a.txt"), cluster.target) == [b"one", b"two"]
        canonical_root = os.path.realpath(root)
        for path in [str(secret), str(root / "link.txt")]:
            with pytest.raises(errors.PermissionDeniedError) as e:
                _distributed(path, cluster.target)
            message = str(e.value)
            assert f"refused to read '{path}': " in message, message
            assert f"outside the data roots ({canonical_root})" in message, message
    finally:
        stop_cluster(cluster)


def test_a_data_root_that_is_not_a_directory_stops_the_server(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(errors.OpError) as e:
        sluice.DispatchServer(sluice.DispatcherConfig(data_roots=[str(missing)]))
    assert f"data root '{missing}' cannot be used" in str(e.value)
