"""The project's own gates, run with the suite so that CI holds every change to them: lint, format, types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON_TREES = ["src", "tests", "e2e", "benchmarks", "scripts", "conftest.py"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("ruff", "check", *PYTHON_TREES), id="ruff-check"),
        pytest.param(("ruff", "format", "--check", *PYTHON_TREES), id="ruff-format"),
        pytest.param(("mypy",), id="mypy-strict"),
    ],
)
def test_the_tree_passes_its_gate(command: tuple[str, ...]) -> None:
    result = _run(*command)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"
