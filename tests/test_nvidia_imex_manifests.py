"""NVIDIA's IMEX example manifests (tests/fixtures/nvidia-imex, unedited): the chart rendered with compat=nvidia
serves their ComputeDomains as written, and ``dradriver explain --compat nvidia`` says what it can of each
(docs/computedomains.md, "NVIDIA's example manifests"). tests/cluster/test_nvidia_feature_manifests.py applies the
channel-injection ones to the API server with the controller run --compat nvidia;
tests/node/test_nvidia_imex_examples.py runs them on the real kubelet."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.helm import template

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cli.explain_input import chart_classes
from dradriver.cli.main import main
from dradriver.computedomain import api
from dradriver.driver.prepare import presets

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures/nvidia-imex"
MANIFESTS = sorted(FIXTURES.glob("*.yaml"))
# Kinds the official schemas know; ComputeDomain (NVIDIA's CRD) and MPIJob (Kubeflow's) are not Kubernetes'.
BUILT_IN = {"Namespace", "ResourceClaim", "ResourceClaimTemplate", "Deployment", "Pod"}
# A simulated GB200 tray: the nodes NVIDIA's IMEX examples are written for.
TRAY = ["--compat", "nvidia", "--sim-profile", "gb200-nvl72-tray", "--mig-mode", "none"]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_every_example_of_nvidias_imex_demo_is_kept() -> None:
    assert [p.name for p in MANIFESTS] == [
        "channel-injection-all.yaml",
        "channel-injection.yaml",
        "imex-test1.yaml",
        "nvbandwidth-test-job-1.yaml",
        "nvbandwidth-test-job-2.yaml",
        "nvbandwidth-test-job.yaml",
        "nvbandwidth-test-no-compute-domain-job.yaml",
    ]


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_their_kubernetes_objects_pass_the_official_schemas(path: Path) -> None:
    for doc in documents(path):
        if doc["kind"] in BUILT_IN:
            kubernetes_validate.validate(doc, "1.35.0", strict=True)


def test_explain_refuses_imex_test1s_channel_claims_naming_the_class_no_chart_installs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["explain", *TRAY, str(FIXTURES / "imex-test1.yaml")])
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    # The four channel claims name imex.nvidia.com, a class of NVIDIA's legacy IMEX channels: neither NVIDIA's
    # chart of this commit nor ours installs it, so the scheduler would leave their pods unschedulable.
    for deployment in range(4):
        assert (
            f"ResourceClaim imex-test1/deployment{deployment}-imex-channel: field "
            "spec.devices.requests[0].exactly.deviceClassName: DeviceClass imex.nvidia.com does not exist"
        ) in captured.err
    # Its GPU template names NVIDIA's GPU class, which --compat nvidia serves.
    assert "ResourceClaimTemplate imex-test1/node-gpus (" in captured.out
    assert "fits on node gb200-nvl72-tray" in captured.out


COMPUTE_DOMAIN_MANIFESTS = ["channel-injection", "channel-injection-all", "nvbandwidth-test-job"]


def explained(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    """explain's exit status and its claims (-o json), each without its source (a file name)."""
    code = main(["explain", *argv, "-o", "json"])
    claims = json.loads(capsys.readouterr().out)["claims"]
    return code, [{k: v for k, v in claim.items() if k != "source"} for claim in claims]


def as_ours(text: str) -> str:
    """``text`` with each of NVIDIA's ComputeDomain names (group, driver, classes) and its GPU driver's name (the GPUs
    a channel's class rejects) swapped for ours."""
    for field in dataclasses.fields(api.ComputeDomainNames):
        text = text.replace(getattr(api.NVIDIA, field.name), getattr(api.OURS, field.name))
    return text.replace(f"{presets.NVIDIA.driver_name}/", f"{DEFAULT_DRIVER_NAME}/")


@pytest.mark.parametrize("name", COMPUTE_DOMAIN_MANIFESTS)
def test_explain_under_compat_nvidia_reads_their_compute_domain_as_it_reads_ours(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NVIDIA's manifest, unedited, under --compat nvidia says what the same manifest with our group says without it
    (as examples/computedomains/channel-injection.yaml does): its channel claim fits, NVIDIA's names in place of
    ours."""
    path = FIXTURES / f"{name}.yaml"
    ours = tmp_path / path.name
    ours.write_text(
        yaml.safe_dump_all(
            [{**d, "apiVersion": api.API_VERSION} if d["kind"] == "ComputeDomain" else d for d in documents(path)]
        )
    )
    code, nvidia_claims = explained([*TRAY, str(path)], capsys)
    our_code, our_claims = explained([*TRAY[2:], str(ours)], capsys)
    assert (code, our_code) == (0, 0)
    [claim] = nvidia_claims
    assert claim["fits"] and claim["kind"] == "ResourceClaimTemplate"
    [result] = claim["report"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["device"]) == (api.NVIDIA.driver_name, "channel-0")
    [config] = claim["report"]["allocation"]["devices"]["config"]
    assert config["opaque"]["parameters"]["apiVersion"] == api.NVIDIA.api_version
    assert json.loads(as_ours(json.dumps(nvidia_claims))) == our_claims


@pytest.mark.parametrize(("compat", "group"), [([], api.NVIDIA.group), (["--compat", "nvidia"], api.OURS.group)])
def test_explain_skips_a_compute_domain_of_the_group_its_compat_does_not_serve(
    compat: list[str], group: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the controller leaves a ComputeDomain of the other group alone, explain finds no claim in it."""
    path = tmp_path / "channel-injection.yaml"
    path.write_text(
        yaml.safe_dump_all(
            [
                {**d, "apiVersion": f"{group}/{api.VERSION}"} if d["kind"] == "ComputeDomain" else d
                for d in documents(FIXTURES / "channel-injection.yaml")
            ]
        )
    )
    assert main(["explain", *compat, *TRAY[2:], str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path} #1: skipped ComputeDomain " in err
    assert f"no ResourceClaim or ResourceClaimTemplate found in {path}" in err


@pytest.mark.parametrize(("compat", "names"), [("none", api.OURS), ("nvidia", api.NVIDIA)])
def test_explain_assumes_the_compute_domain_classes_of_its_compat(compat: str, names: api.ComputeDomainNames) -> None:
    """The classes explain assumes (rendered from the chart by scripts/gen-manifests) are those the names object
    makes, of the group --compat serves and no other."""
    assumed = [c for c in chart_classes(compat) if c["metadata"]["name"].startswith("compute-domain-")]
    assert [(c["metadata"]["name"], c["spec"]) for c in assumed] == [
        (c["metadata"]["name"], c["spec"]) for c in api.device_classes(names)
    ]


def test_our_channel_injection_example_is_nvidias_with_our_api_version() -> None:
    """What tests/cluster/test_computedomains.py runs as "NVIDIA's IMEX demo with our API version" is NVIDIA's
    manifest with nothing but the ComputeDomain's apiVersion changed."""
    nvidia = documents(FIXTURES / "channel-injection.yaml")
    for doc in nvidia:
        if doc["kind"] == "ComputeDomain":
            doc["apiVersion"] = api.API_VERSION
    assert documents(ROOT / "examples/computedomains/channel-injection.yaml") == nvidia


@pytest.mark.parametrize("name", ["channel-injection", "channel-injection-all", "nvbandwidth-test-job"])
def test_the_chart_with_compat_nvidia_serves_their_compute_domains_as_written(name: str) -> None:
    """Their ComputeDomain is of a CRD the chart renders with compat=nvidia and valid by that CRD's openAPI schema
    (checked here as JSON schema; its CEL rules are the API server's, tests/cluster/test_nvidia_feature_manifests.py),
    its spec one our model takes, and the channel claim template the controller makes of it asks for a DeviceClass
    of that same render."""
    rendered = template("--set", "computeDomains.enabled=true", "--set", "compat=nvidia")
    served = {
        (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"]): version["schema"][
            "openAPIV3Schema"
        ]
        for crd in rendered
        if crd["kind"] == "CustomResourceDefinition"
        for version in crd["spec"]["versions"]
        if version["served"]
    }
    classes = {o["metadata"]["name"] for o in rendered if o["kind"] == "DeviceClass"}
    [domain] = [d for d in documents(FIXTURES / f"{name}.yaml") if d["kind"] == "ComputeDomain"]
    schema = served[(domain["apiVersion"], domain["kind"])]
    assert [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(domain)] == []
    api.parse_spec(domain)
    requests = api.workload_claim_template(domain, api.NVIDIA)["spec"]["spec"]["devices"]["requests"]
    assert {r["exactly"]["deviceClassName"] for r in requests} <= classes
