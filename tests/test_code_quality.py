"""The project's own gates, run with the suite so that CI holds every change to them: lint, format, types, and the
import contracts that keep the layers apart (pyproject.toml's ``[tool.importlinter]``)."""

from __future__ import annotations

import os
import shutil
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
        # The Python examples in README.md and docs/ too (ruff formats Markdown's ```python blocks).
        pytest.param(("ruff", "format", "--check", "README.md", "docs"), id="ruff-format-docs"),
        pytest.param(("mypy",), id="mypy-strict"),
    ],
)
def test_the_tree_passes_its_gate(command: tuple[str, ...]) -> None:
    result = _run(*command)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``dradriver`` package under ``root / "src"``, with ``root``'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}  # this tree's package, not the installed one
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, f"lint-imports failed:\n{result.stdout}{result.stderr}"
    assert "0 broken" in result.stdout


# (module, the import planted in it, words of the contract it breaks)
PLANTED = {
    "plugin-to-driver": (
        "plugin/handler.py",
        "import dradriver.driver.prepare.state",
        "The plugin layer knows nothing",
    ),
    "prepare-to-checks": (
        "driver/prepare/state.py",
        "import dradriver.driver.checks.host",
        "Our driver by concern",
    ),
    "driver-to-sim": ("driver/prepare/checkpoint.py", "import dradriver.sim.node", "only through the backend factory"),
    "gpu-to-cli": ("gpu/models.py", "import dradriver.cli.main", "Layers:"),
    "cel-to-allocator": ("cel/ast.py", "import dradriver.allocator.model", "Layers:"),
}


@pytest.mark.parametrize(("module", "planted", "contract"), list(PLANTED.values()), ids=list(PLANTED))
def test_a_planted_wrong_import_breaks_a_contract(tmp_path: Path, module: str, planted: str, contract: str) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    package = tmp_path / "src" / "dradriver"
    shutil.copytree(ROOT / "src" / "dradriver", package, ignore=shutil.ignore_patterns("__pycache__"))
    target = package / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, f"lint-imports passed with {planted!r} in {module}:\n{result.stdout}"
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in broken, result.stdout
