"""Fixtures of the process tests: a short scratch directory and the API stand-in with this node's Node."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer

NODE = "node-a"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # short: unix socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api(root: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server
