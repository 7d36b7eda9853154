"""NVIDIA's feature gates (tests/fixtures/nvidia-feature-gates.yaml, read from NVIDIA's pkg/featuregates at the commit
recorded there) each have their row in docs/nvidia-compatibility.md, "NVIDIA's feature gates", saying what takes the
gate's place here; every flag a row names is one ``dradriver run`` takes, every chart value one the chart has and
renders; and the section's values files are refused and rendered by our chart as it says."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helm import CHART, run_helm, template

from dradriver.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/nvidia-compatibility.md"
FIXTURE = ROOT / "tests/fixtures/nvidia-feature-gates.yaml"
VALUES = CHART / "values.yaml"
SECTION = "## NVIDIA's feature gates\n"
# What a row may say takes a gate's place here; the notes say why for the last two.
HERE = ("always on", "flag + chart value", "not needed", "not supported")
CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One row of the table: NVIDIA's gate and its default, and ours."""

    gate: str
    default: str
    here: str
    flag: str  # "`--mig-mode dynamic`", or "—"
    value: str  # "`gpu.migMode: dynamic`", or "—"


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def rows() -> list[Row]:
    """The table's rows (each starts with a gate's name in code), not its header."""
    found = []
    for line in section().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        gate = CODE.fullmatch(cells[0]) if line.startswith("| `") else None
        if gate:
            found.append(Row(gate[1], *cells[1:5]))
    return found


def gates() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(FIXTURE.read_text())["gates"]
    return found


def code_of(cell: str) -> str | None:
    """The one code span of a flag or value cell, or None for "—"."""
    spans = CODE.findall(cell)
    assert len(spans) <= 1, f"one flag or value per cell: {cell}"
    return spans[0] if spans else None


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", section(), flags=re.S)


def test_the_fixture_is_nvidias_list_at_the_recorded_commit() -> None:
    recorded = yaml.safe_load(FIXTURE.read_text())
    assert recorded["commit"] == "95932046683719c43b6a0dd9613c2e5aad5d6703"
    assert recorded["path"] == "pkg/featuregates/featuregates.go"
    assert len({g["name"] for g in gates()}) == len(gates()) == 13


def test_every_gate_of_nvidias_has_exactly_one_row_with_its_default() -> None:
    table = rows()
    assert [r.gate for r in table] == [g["name"] for g in gates()]
    for row, gate in zip(table, gates(), strict=True):
        assert row.default == f"{'on' if gate['default'] else 'off'} ({gate['stage']})", row.gate


def test_every_row_says_what_takes_the_gates_place() -> None:
    for row in rows():
        assert row.here in HERE, f"{row.gate}: {row.here!r} is not one of {HERE}"
        if row.here == "flag + chart value":
            assert code_of(row.flag) and code_of(row.value), f"{row.gate}: name its flag and chart value"


@pytest.mark.parametrize("row", [r for r in rows() if code_of(r.flag)], ids=lambda r: r.gate)
def test_each_flag_named_is_one_dradriver_run_takes(row: Row) -> None:
    flag = code_of(row.flag)
    assert flag is not None
    # Parsed as a user types it: the flag exists and takes the value the row gives.
    build_parser(["run"]).parse_args(["run", *flag.split()])


def value_at(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        assert isinstance(node, dict) and key in node, f"values.yaml has no {dotted}"
        node = node[key]
    return node


@pytest.mark.parametrize("row", [r for r in rows() if code_of(r.value)], ids=lambda r: r.gate)
def test_each_chart_value_named_is_the_charts_and_renders(row: Row) -> None:
    value = code_of(row.value)
    assert value is not None
    [(key, setting)] = yaml.safe_load(value).items()
    value_at(yaml.safe_load(VALUES.read_text()), key)
    setting = str(setting).lower() if isinstance(setting, bool) else str(setting)
    assert any(o["kind"] == "DaemonSet" for o in template("--set", f"{key}={setting}"))


def test_nvidias_values_file_is_refused_by_our_chart_as_the_section_shows(tmp_path: Path) -> None:
    nvidia, _ours = yaml_blocks()
    assert {g["name"] for g in gates()} >= set(yaml.safe_load(nvidia)["featureGates"])
    (tmp_path / "nvidia-values.yaml").write_text(nvidia)
    done = run_helm("template", "dradriver", str(CHART), "-f", str(tmp_path / "nvidia-values.yaml"))
    assert done.returncode != 0
    shown = re.findall(r"^- at '([^']*)': (.*)$", section(), flags=re.M)
    said = re.findall(r"^- at '([^']*)': (.*)$", done.stderr, flags=re.M)
    assert {at: refused_names(what) for at, what in said} == {at: refused_names(what) for at, what in shown}
    # NVIDIA's feature switches under resources would otherwise become the plugin container's resources.
    assert "/resources" in dict(said)


def refused_names(line: str) -> set[str]:
    """The values a schema error refuses ("additional properties 'a', 'b' not allowed": helm lists them in any
    order)."""
    assert line.endswith(" not allowed"), line
    return set(re.findall(r"'([^']+)'", line))


def test_its_translation_renders_with_the_settings_it_names(tmp_path: Path) -> None:
    _nvidia, ours = yaml_blocks()
    (tmp_path / "values.yaml").write_text(ours)
    [daemonset] = [o for o in template("-f", str(tmp_path / "values.yaml")) if o["kind"] == "DaemonSet"]
    env = {
        e["name"]: e.get("value") for c in daemonset["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])
    }
    assert env["DRADRIVER_COMPAT"] == "nvidia"
    assert env["DRADRIVER_LIST_ATTRIBUTES"] == "true"
    assert env["DRADRIVER_CONSUMABLE_SHARES"] == "memory"
    assert env["DRADRIVER_IMEX_MODE"] == "hostManaged"
