"""The chart's fabricManagerPartitions and computeDomains.imex values, judged by the real helm: off by default, on
they hand `dradriver run` --fabric-manager-partitions and --imex-mode through the variables it reads (and
`dradriver cd-controller` --imex-mode)."""

from __future__ import annotations

from typing import Any

import pytest
from support.helm import CHART, RELEASE, run_helm, template
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


def test_host_managed_imex_reaches_the_plugin_only_when_chosen(monkeypatch: Any) -> None:
    assert "DRADRIVER_IMEX_MODE" not in env_with("computeDomains.enabled=true")
    variables = env_with("computeDomains.enabled=true", "computeDomains.imex.mode=hostManaged")
    assert variables["DRADRIVER_IMEX_MODE"] == "hostManaged"
    assert variables["DRADRIVER_IMEX_HOST_SOCKET_PATH"] == "/etc/nvidia-imex/imex_ctrl.sock"
    for name in ("DRADRIVER_IMEX_MODE", "DRADRIVER_IMEX_HOST_SOCKET_PATH"):
        monkeypatch.setenv(name, variables[name])
    args = build_parser(["run"]).parse_args(["run"])
    resolve_env_values(args)
    assert args.imex_mode == "hostManaged"


def test_the_imex_mode_reaches_the_compute_domain_controller_too(monkeypatch: Any) -> None:
    def controller_env(*values: str) -> dict[str, Any]:
        objects = template(*[a for v in ("computeDomains.enabled=true", *values) for a in ("--set", v)])
        [deployment] = [o for o in objects if o["kind"] == "Deployment"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert controller_env()["DRADRIVER_IMEX_MODE"] == "driverManaged"
    variables = controller_env("computeDomains.imex.mode=hostManaged")
    assert variables["DRADRIVER_IMEX_MODE"] == "hostManaged"
    monkeypatch.setenv("DRADRIVER_IMEX_MODE", variables["DRADRIVER_IMEX_MODE"])
    args = build_parser(["cd-controller"]).parse_args(["cd-controller"])
    resolve_env_values(args)
    assert args.imex_mode == "hostManaged"


def test_fabric_manager_s_address_and_timeout_reach_run_only_when_set(monkeypatch: Any) -> None:
    variables = env_with("fabricManagerPartitions.enabled=true")
    assert "DRADRIVER_FABRIC_MANAGER_ADDRESS" not in variables and "DRADRIVER_FABRIC_MANAGER_TIMEOUT" not in variables
    variables = env_with(
        "fabricManagerPartitions.enabled=true",
        "fabricManagerPartitions.address=127.0.0.1:6666",
        "fabricManagerPartitions.timeoutSeconds=3",
    )
    assert variables["DRADRIVER_FABRIC_MANAGER_ADDRESS"] == "127.0.0.1:6666"
    for name in ("DRADRIVER_FABRIC_MANAGER_ADDRESS", "DRADRIVER_FABRIC_MANAGER_TIMEOUT"):
        monkeypatch.setenv(name, variables[name])
    args = build_parser(["run"]).parse_args(["run"])
    resolve_env_values(args)
    assert (args.fabric_manager_address, args.fabric_manager_timeout) == ("127.0.0.1:6666", 3.0)


@pytest.mark.parametrize("value", ["address=run/socket", "timeoutSeconds=0"])
def test_the_schema_refuses_an_address_or_timeout_run_would_refuse(value: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--set", f"fabricManagerPartitions.{value}")
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert value.split("=", maxsplit=1)[0] in done.stderr, done.stderr
