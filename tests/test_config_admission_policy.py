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
from support.helm import template

from dradriver.cel.errors import CelError
from tests.driver.prepare.config_table import BAD, GOOD, NVIDIA, gpu

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def policy() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "manifests/driver/config-admission-policy.yaml").read_text())
    [found] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    return found


# The policy's validations, each by words of its message.
API_KIND = "apiVersion must be"
FIELDS = "unknown field; GpuConfig allows"
COMPUTE_MODE = "computeMode allows"
STRATEGY = "sharing.strategy is required"
NO_MIG_TIME_SLICING = "time-slicing is not a MIG setting"
CHOSEN_ONLY = "set only the chosen strategy's settings"
INTERVAL = "sharing.timeSlicing allows only interval"
MPS_FIELDS = "sharing.mps allows"
PERCENTAGE = "defaultActiveThreadPercentage must be an integer"
MEMORY = "MPS memory limits"
MODE_WITH_SHARING = "computeMode must be ExclusiveProcess (or unset)"
IOMMU = "iommu allows"

# The validations each entry of BAD must trip, in BAD's order: the rule its error names, so that a config denied
# for another reason (a rule written wrong, or a typo in the table) does not pass as refused.
RULES: list[tuple[str, ...]] = [
    (API_KIND,),  # an apiVersion of neither
    (IOMMU,),  # VfioDeviceConfig in ours, IommuFDOnly
    (FIELDS,),
    (STRATEGY,),  # SpacePartitioning
    (STRATEGY,),  # missing
    (INTERVAL,),  # Longer
    (INTERVAL,),  # slices
    (CHOSEN_ONLY,),
    (CHOSEN_ONLY,),
    (PERCENTAGE,),  # 101
    (PERCENTAGE,),  # -1
    (PERCENTAGE,),  # "50"
    (MEMORY,),  # 8GB!
    (MEMORY,),  # 512Ki
    (MEMORY,),  # lots
    (MPS_FIELDS,),  # multiUser "yes"
    (MPS_FIELDS,),  # pinned
    (COMPUTE_MODE,),
    (MODE_WITH_SHARING,),  # Prohibited with MPS
    (MODE_WITH_SHARING,),  # ExclusiveProcess with TimeSlicing
    (NO_MIG_TIME_SLICING,),
    (NO_MIG_TIME_SLICING, CHOSEN_ONLY),  # MPS with timeSlicing settings, on a MIG device
    (FIELDS,),  # computeMode on a MigDeviceConfig
    # NVIDIA's version
    (FIELDS,),  # computeMode
    (STRATEGY,),  # mps, not mpsConfig
    (STRATEGY,),  # timeSlicing, not timeSlicingConfig
    (CHOSEN_ONLY,),
    (CHOSEN_ONLY,),
    (STRATEGY,),  # Vgpu
    (STRATEGY,),  # ""
    (INTERVAL,),  # Longest
    (PERCENTAGE,),
    (MEMORY,),
    (FIELDS,),  # metadata
    (STRATEGY,),  # timeSlicingConfig on a MigDeviceConfig
    (CHOSEN_ONLY,),
    (IOMMU,),  # VfioDeviceConfig, iommu.devices
    (API_KIND, FIELDS),  # ComputeDomainChannelConfig and its domainID
    (API_KIND, FIELDS),  # ComputeDomainDaemonConfig and its domainID
    (API_KIND,),  # MpsConfig
]
REFUSED = [(config, message, rules) for (config, message), rules in zip(BAD, RULES, strict=True)]


def messages(*fragments: str) -> list[str]:
    """The messages of the policy's validations named by ``fragments`` (one each), in the policy's order."""
    found = [v["message"] for v in policy()["spec"]["validations"] if any(f in v["message"] for f in fragments)]
    assert len(found) == len(fragments), (fragments, found)
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


@pytest.mark.parametrize(("config", "message", "rules"), REFUSED)
@pytest.mark.parametrize("template", [False, True])
def test_configs_the_models_refuse_are_denied_by_the_rule_they_break(
    config: dict[str, Any], message: str, rules: tuple[str, ...], template: bool
) -> None:
    assert denials(claim(config, template=template)) == messages(*rules), f"the models say: {message}"


def test_the_driver_variable_is_the_driver_name_of_the_base_install() -> None:
    assert policy()["spec"]["variables"][0] == {"name": "driver", "expression": '"gpu.dradriver.dev"'}


@pytest.mark.parametrize("config", [c for c in GOOD if c["apiVersion"] == NVIDIA])
def test_under_the_nvidia_preset_nvidias_configs_are_admitted(config: dict[str, Any]) -> None:
    assert denials(claim(config, driver="gpu.nvidia.com"), driver="gpu.nvidia.com") == []


@pytest.mark.parametrize(("config", "message", "rules"), [r for r in REFUSED if r[0].get("apiVersion") == NVIDIA])
def test_under_the_nvidia_preset_configs_the_models_refuse_are_denied(
    config: dict[str, Any], message: str, rules: tuple[str, ...]
) -> None:
    assert denials(claim(config, driver="gpu.nvidia.com"), driver="gpu.nvidia.com") == messages(*rules), message


def test_other_drivers_configs_and_claims_without_config_are_not_judged() -> None:
    assert denials(claim({"anything": True}, driver="gpu.nvidia.com")) == []
    assert denials({"kind": "ResourceClaim", "spec": {"devices": {"requests": []}}}) == []


def test_a_compute_domain_config_given_the_gpu_driver_is_denied_naming_the_compute_domain_driver() -> None:
    """NVIDIA's ComputeDomain configs are served, by the ComputeDomain driver: the denial says which driver to name."""
    channel = {"apiVersion": NVIDIA, "kind": "ComputeDomainChannelConfig"}
    [message] = messages(API_KIND)
    assert message in denials(claim(channel, driver="gpu.nvidia.com"), driver="gpu.nvidia.com")
    assert message.endswith(
        "ComputeDomainDaemonConfig are the ComputeDomain driver's: give them driver compute-domain.dradriver.dev)"
    )
    nvidia = next(o for o in template("--set", "compat=nvidia") if o["metadata"]["name"] == "dradriver-opaque-config")
    [rendered] = [v["message"] for v in nvidia["spec"]["validations"] if API_KIND in v["message"]]
    assert rendered.startswith("gpu.nvidia.com config:")
    assert rendered.endswith("give them driver compute-domain.nvidia.com)")


def test_a_denial_names_the_field() -> None:
    [message] = denials(claim(gpu(computeMode="Exclusive")))
    assert "computeMode allows Default, ExclusiveProcess or Prohibited" in message


def test_the_policy_is_installed_by_the_base() -> None:
    kustomization = yaml.safe_load((ROOT / "manifests/driver/Kustomization").read_text())
    assert "config-admission-policy.yaml" in kustomization["resources"]
