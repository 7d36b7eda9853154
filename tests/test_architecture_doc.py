"""docs/architecture.md lists every module of the tree, by package, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "dradriver"


def _documented() -> dict[str, set[str]]:
    """Package (``cli``, ``plugin/cluster``, ``""`` for the top level) → the modules the tree block names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    modules: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        head = re.match(r"^(\S[^ ]*/|\(top level\))\s+(.*)$", line)
        rest = head.group(2) if head else line.strip()
        if head:
            package = "" if head.group(1) == "(top level)" else head.group(1).rstrip("/")
        if package is None or package == "api":
            continue
        names = re.sub(r"\(.*?\)", "", rest)
        modules.setdefault(package, set()).update(n.strip() for n in names.split(",") if n.strip())
    return modules


def _actual() -> dict[str, set[str]]:
    modules: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "api" or path.name == "__init__.py":
            continue
        modules.setdefault("/".join(relative.parts[:-1]), set()).add(path.stem)
    return modules


def test_the_architecture_page_names_every_module_of_the_tree() -> None:
    assert _documented() == _actual()
