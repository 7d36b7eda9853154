"""The admission policy for gpu.dradriver.dev opaque configs, run with our CEL evaluator over the same table of
good and bad configs as the pydantic models (tests/driver/prepare/config_table.py): the two must agree on every
entry."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cel_admission import evaluate, evaluate_variable

from dradriver.cel.errors import CelError
from tests.driver.prepare.config_table import BAD, GOOD, NVIDIA, gpu

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def policy() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "manifests/driver/config-admission-policy.yaml").read_text())
    [found] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    return found


def claim(*parameters: Any, template: bool = False, driver: str = "gpu.dradriver.dev") -> dict[str, Any]:
    devices = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}],
        "config": [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": p}} for p in parameters],
    }
    if template:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "spec": {"spec": {"devices": devices}},
        }
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": {"devices": devices}}


def denials(obj: dict[str, Any], driver: str = "gpu.dradriver.dev") -> list[str]:
    """The messages of the validations that deny ``obj`` (an evaluation error denies too: failurePolicy Fail),
    with the policy's ``driver`` variable set to ``driver`` as an overlay sets it (tests/test_manifests.py)."""
    spec = policy()["spec"]
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        expression = f'"{driver}"' if variable["name"] == "driver" else variable["expression"]
        variables[variable["name"]] = evaluate_variable(expression, object=obj, variables=variables)
    denied = []
    for validation in spec["validations"]:
        try:
            ok = evaluate(validation["expression"], object=obj, variables=variables)
        except CelError as err:
            ok = f"error: {err}"
        if ok is not True:
            denied.append(validation["message"])
    return denied


@pytest.mark.parametrize("config", GOOD)
@pytest.mark.parametrize("template", [False, True])
def test_configs_the_models_accept_are_admitted(config: dict[str, Any], template: bool) -> None:
    assert denials(claim(config, template=template)) == []


@pytest.mark.parametrize(("config", "message"), BAD)
@pytest.mark.parametrize("template", [False, True])
def test_configs_the_models_refuse_are_denied(config: dict[str, Any], message: str, template: bool) -> None:
    assert denials(claim(config, template=template)), f"admitted, but the models say: {message}"


def test_the_driver_variable_is_the_driver_name_of_the_base_install() -> None:
    assert policy()["spec"]["variables"][0] == {"name": "driver", "expression": '"gpu.dradriver.dev"'}


@pytest.mark.parametrize("config", [c for c in GOOD if c["apiVersion"] == NVIDIA])
def test_under_the_nvidia_preset_nvidias_configs_are_admitted(config: dict[str, Any]) -> None:
    assert denials(claim(config, driver="gpu.nvidia.com"), driver="gpu.nvidia.com") == []


@pytest.mark.parametrize(("config", "message"), [(c, m) for c, m in BAD if c.get("apiVersion") == NVIDIA])
def test_under_the_nvidia_preset_configs_the_models_refuse_are_denied(config: dict[str, Any], message: str) -> None:
    assert denials(claim(config, driver="gpu.nvidia.com"), driver="gpu.nvidia.com"), message


def test_other_drivers_configs_and_claims_without_config_are_not_judged() -> None:
    assert denials(claim({"anything": True}, driver="gpu.nvidia.com")) == []
    assert denials({"kind": "ResourceClaim", "spec": {"devices": {"requests": []}}}) == []


def test_a_denial_names_the_field() -> None:
    [message] = denials(claim(gpu(computeMode="Exclusive")))
    assert "computeMode allows Default, ExclusiveProcess or Prohibited" in message


def test_the_policy_is_installed_by_the_base() -> None:
    kustomization = yaml.safe_load((ROOT / "manifests/driver/Kustomization").read_text())
    assert "config-admission-policy.yaml" in kustomization["resources"]
