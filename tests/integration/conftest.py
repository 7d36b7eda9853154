"""Fixtures of the process tests: a short scratch directory and the API stand-in with this node's Node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer
from support.short_dirs import short_dir

NODE = "node-a"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir("dra-") as path:
        yield path


@pytest.fixture
def api(root: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server
