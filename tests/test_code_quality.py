"""The project's own gates, run with the suite so that CI holds every change to them: lint, format, types, the
import contracts that keep the layers apart (pyproject.toml's ``[tool.importlinter]``), no import circles, and the
size limits of functions and constructors."""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import grimp
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
    # Each allowed by the layers contract: only the contract of the driver's concerns, or of NVIDIA's install, breaks.
    "prepare-to-observe": (
        "driver/prepare/reconcile.py",
        "import dradriver.driver.observe.metrics",
        "Our driver by concern",
    ),
    "prepare-to-publish": (
        "driver/prepare/checkpoint.py",
        "import dradriver.driver.publish.slices",
        "Our driver by concern",
    ),
    "nvidia-install-to-plugin": (
        "nvidia_install/cdi.py",
        "import dradriver.plugin.handler",
        "NVIDIA's install on the host knows nothing",
    ),
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


def import_circles(package: str) -> list[list[str]]:
    """The import circles among ``package``'s modules, each as a chain ``a -> b -> … -> a``: at least one through
    every module that is on a circle. Imports under ``TYPE_CHECKING`` and inside functions count (grimp reads every
    import statement): a circle only some of the time is still two modules that cannot be read apart."""
    graph = grimp.build_graph(package, include_external_packages=False, cache_dir=None)
    circles: list[list[str]] = []
    on_a_circle: set[str] = set()
    for importer in sorted(graph.modules):
        if importer in on_a_circle:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                circles.append([importer, *back])
                on_a_circle.update(back)
                break
    return circles


def test_no_import_circles() -> None:
    circles = import_circles("dradriver")
    assert not circles, "import circles in src/dradriver:\n" + "\n".join(" -> ".join(c) for c in circles)


# How the planted module imports back the module that imports it.
PLANTED_CIRCLES = {
    "at-module-level": "import {package}.a\n",
    "under-type-checking": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from {package}.a import A\n",
    "in-a-function": "def make():\n    from {package}.a import A\n\n    return A()\n",
}


@pytest.mark.parametrize("back", list(PLANTED_CIRCLES.values()), ids=list(PLANTED_CIRCLES))
def test_a_planted_import_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back: str) -> None:
    package = f"circled_{tmp_path.name.replace('-', '_')}"  # a name of its own: nothing is imported, only read
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text(f"from {package}.b import B\n\n\nclass A(B):\n    pass\n")
    (root / "b.py").write_text(back.format(package=package) + "\n\nclass B:\n    pass\n")
    (root / "c.py").write_text(f"from {package}.a import A\n")  # imports into the circle, is not on it
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles(package) == [[f"{package}.a", f"{package}.b", f"{package}.a"]]


MAX_FUNCTION_LINES = 60
MAX_CONSTRUCTOR_PARAMETERS = 8  # besides self


def _functions(tree: Path) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method under ``tree`` (nested ones too), named ``path:line Class.name``; the generated
    protobuf code aside."""
    for path in sorted(tree.rglob("*.py")):
        if "generated" in path.relative_to(tree).parts:
            continue
        where = path.relative_to(tree.parent)
        stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text(), str(path)), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{where}:{child.lineno} {prefix}{child.name}", child
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}."))
                else:
                    stack.append((child, prefix))


def long_functions(tree: Path) -> list[str]:
    """The functions over ``MAX_FUNCTION_LINES`` lines, from ``def`` to their last line (decorators aside)."""
    found = []
    for name, function in _functions(tree):
        assert function.end_lineno is not None
        lines = function.end_lineno - function.lineno + 1
        if lines > MAX_FUNCTION_LINES:
            found.append(f"{name}: {lines} lines")
    return found


def crowded_constructors(tree: Path) -> list[str]:
    """The ``__init__`` methods taking over ``MAX_CONSTRUCTOR_PARAMETERS`` parameters besides self (``*args`` and
    ``**kwargs`` count one each): a constructor that needs more takes an options object."""
    found = []
    for name, function in _functions(tree):
        if function.name != "__init__":
            continue
        arguments = function.args
        count = len(arguments.posonlyargs) + len(arguments.args) + len(arguments.kwonlyargs) - 1
        count += (arguments.vararg is not None) + (arguments.kwarg is not None)
        if count > MAX_CONSTRUCTOR_PARAMETERS:
            found.append(f"{name}: {count} parameters")
    return found


def test_no_function_is_over_60_lines() -> None:
    found = long_functions(ROOT / "src" / "dradriver")
    assert not found, "split these into the steps they take:\n" + "\n".join(found)


def test_no_constructor_takes_over_8_parameters() -> None:
    found = crowded_constructors(ROOT / "src" / "dradriver")
    assert not found, "group these parameters into an options object:\n" + "\n".join(found)


def _statements(count: int, indent: str) -> str:
    return "".join(f"{indent}x{i} = {i}\n" for i in range(count))


def test_the_size_checks_find_what_is_over_the_limits(tmp_path: Path) -> None:
    tree = tmp_path / "package"
    (tree / "generated").mkdir(parents=True)
    limit = MAX_FUNCTION_LINES
    crowded = "    def __init__(self, a, b, c, d, e, f, g, *, h, **options):"
    source = (
        "import functools\n\n\n"
        "@functools.cache\n"  # a decorator's line is not the function's
        f"def at_the_limit():\n{_statements(limit - 1, '    ')}"
        "\n\nclass Holder:\n"
        f"    def over_the_limit(self):\n{_statements(limit, '        ')}"
        f"\n{crowded}\n        pass\n"
        "\n\nclass AtTheLimit:\n    def __init__(self, a, b, c, d, e, f, g, h):\n        pass\n"
    )
    (tree / "module.py").write_text(source)
    (tree / "generated" / "code.py").write_text(f"def generated():\n{_statements(limit, '    ')}")
    lines = source.splitlines()
    over = lines.index("    def over_the_limit(self):") + 1
    assert long_functions(tree) == [f"package/module.py:{over} Holder.over_the_limit: {limit + 1} lines"]
    assert crowded_constructors(tree) == [f"package/module.py:{lines.index(crowded) + 1} Holder.__init__: 9 parameters"]


TEST_TREES = ["tests", "e2e", "benchmarks"]
BROAD = {"Exception", "BaseException"}


def broad_raises(tree: Path) -> list[str]:
    """``pytest.raises`` of ``Exception`` or ``BaseException`` under ``tree``, with or without ``match=``, and lines
    that switch off ruff's checks of broad raises (B017, PT011): such a test passes on any failure, the one it
    means or another."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        where = path.relative_to(tree.parent)
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "raises"
                and node.args
                and ast.unparse(node.args[0]) in BROAD
            ):
                found.append(f"{where}:{node.lineno} pytest.raises({ast.unparse(node.args[0])})")
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and re.search(r"noqa:[\w\s,]*\b(B017|PT011)\b", token.string):
                found.append(f"{where}:{token.start[0]} noqa of a broad raises")
    return found


def test_no_test_passes_on_any_exception() -> None:
    found = [f for tree in TEST_TREES for f in broad_raises(ROOT / tree)]
    assert not found, "raise the specific type, with match= naming the failure meant:\n" + "\n".join(found)


def test_the_broad_raises_check_finds_them(tmp_path: Path) -> None:
    tree = tmp_path / "tests"
    tree.mkdir()
    (tree / "test_x.py").write_text(
        "import pytest\n\n\n"
        "def test_a():\n"
        "    with pytest.raises(Exception, match='x'):\n"
        "        pass\n"
        "    with pytest.raises(ValueError, match='y'):\n"
        "        pass\n"
        "    with pytest.raises(BaseException):  # noqa: B017\n"
        "        pass\n"
    )
    assert broad_raises(tree) == [
        "tests/test_x.py:5 pytest.raises(Exception)",
        "tests/test_x.py:9 pytest.raises(BaseException)",
        "tests/test_x.py:9 noqa of a broad raises",
    ]
