"""Every third-party module that src/ imports belongs to a distribution that pyproject.toml declares."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "dradriver"


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        if "generated" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"dradriver", "__future__"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_normalise(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in project["dependencies"]}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_of_src_is_a_declared_dependency() -> None:
    distributions = packages_distributions()
    declared = _declared()
    undeclared = {}
    for module in sorted(_imported_top_levels()):
        providers = {_normalise(d) for d in distributions.get(module, [])}
        if not providers & declared:
            undeclared[module] = sorted(providers) or ["(no installed distribution)"]
    assert not undeclared, f"declare these in pyproject.toml [project] dependencies: {undeclared}"
