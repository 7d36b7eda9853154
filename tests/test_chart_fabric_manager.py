"""The chart's fabricManagerPartitions value (docs/partitions.md), judged by the real helm: off by default, on it
hands `dradriver run` --fabric-manager-partitions through the variable it reads."""

from __future__ import annotations

from typing import Any

from support.helm import template
from test_chart import container_env

from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.main import build_parser

VARIABLE = "DRADRIVER_FABRIC_MANAGER_PARTITIONS"


def env_with(*values: str) -> dict[str, Any]:
    return container_env(template(*[a for v in values for a in ("--set", v)]))


def test_partitions_are_off_by_default() -> None:
    assert VARIABLE not in env_with()


def test_the_value_turns_the_flag_on(monkeypatch: Any) -> None:
    variables = env_with("fabricManagerPartitions.enabled=true")
    assert variables[VARIABLE] == "true"
    monkeypatch.setenv(VARIABLE, variables[VARIABLE])
    args = build_parser(["run"]).parse_args(["run"])
    resolve_env_values(args)
    assert args.fabric_manager_partitions == "true"
