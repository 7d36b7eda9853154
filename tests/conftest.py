"""Suite-wide set-up: subprocesses started by tests import this checkout's ``src``; simulated-node fixtures."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

SRC = str(Path(__file__).resolve().parent.parent / "src")

# Tests that start `python -m dradriver …` as a real process must run this tree's code, whether or not the
# package is installed (and even if another copy is).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

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
