"""Shared helpers of the GPU-layer tests: simulated nodes from built-in profiles or from written profile files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.gpu.catalog import load_node_profile
from dradriver.gpu.sim import SimulatedNode

MakeNode = Callable[..., SimulatedNode]


@pytest.fixture
def make_node() -> MakeNode:
    """``make_node("dgx-a100-80gb", state_path=..., privileged=...)`` → a fresh simulated node."""

    def make(profile: str = "dgx-a100-80gb", **options: object) -> SimulatedNode:
        return SimulatedNode(load_node_profile(profile), **options)

    return make


@pytest.fixture
def profile_file(tmp_path: Path) -> Callable[[str], str]:
    """Write a node-profile YAML text to a file and return its path."""

    def write(text: str) -> str:
        path = tmp_path / "node.yaml"
        path.write_text(text)
        return str(path)

    return write
