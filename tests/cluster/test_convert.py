"""`dradriver convert`'s output is accepted by the real API server with strict field validation (a field it does
not know is an error, not dropped): claims, templates, DeviceClasses and the rewritten workloads, as a dry run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.control_plane import ControlPlane
from support.kube_rest import ApiError

from dradriver.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/device-plugin"
# kind: (API prefix, plural, namespaced)
ENDPOINTS = {
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "Pod": ("/api/v1", "pods", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Job": ("/apis/batch/v1", "jobs", True),
}
CASES = {
    "limits-only and runtime class": ["limits-only-pod.yaml", "runtime-class-pod.yaml"],
    "time-sliced deployment": ["time-slicing-config.yaml", "time-sliced-deployment.yaml"],
    "mps deployment": ["mps-config.yaml", "time-sliced-deployment.yaml"],
    "mig mixed": ["mig-mixed-time-slicing-config.yaml", "mig-mixed-pod.yaml"],
    "mig single": ["mig-single-config.yaml", "limits-only-pod.yaml"],
    "renamed, configmap": ["time-slicing-renamed-configmap.yaml", "shared-job.yaml", "--config", "shared"],
    "renamed, keep limits": [
        "time-slicing-renamed-configmap.yaml",
        "shared-job.yaml",
        "--config",
        "shared",
        "--keep-limits",
    ],
}


def converted(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[dict[str, Any]]:
    assert main(["convert", *[str(FIXTURES / a) if a.endswith(".yaml") else a for a in args]]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_the_api_server_accepts_converts_output(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    docs = converted(capsys, args)
    assert docs
    for obj in docs:
        prefix, plural, namespaced = ENDPOINTS[obj["kind"]]
        namespace = obj["metadata"].get("namespace", "default")
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced else f"{prefix}/{plural}"
        stored = control_plane.kube.request("POST", path, obj, fieldValidation="Strict", dryRun="All")
        assert kept(obj["spec"], stored["spec"]), (obj["spec"], stored["spec"])


def kept(sent: Any, stored: Any) -> bool:
    """Every field sent came back as sent (the server may add defaults beside them)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(kept(v, stored.get(k)) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(stored, list) and len(sent) == len(stored) and all(map(kept, sent, stored))
    return str(sent) == str(stored)


def test_strict_validation_refuses_an_unknown_field(control_plane: ControlPlane) -> None:
    """The check above can fail: a field the server does not know is refused, not dropped."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "unknown-field", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x", "replicas": 4}}]}},
    }
    with pytest.raises(ApiError) as refused:
        control_plane.kube.request(
            "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim, fieldValidation="Strict",
            dryRun="All",
        )  # fmt: skip
    assert refused.value.status == 400 and "replicas" in str(refused.value)


@pytest.mark.parametrize(("quantity", "taken"), [("2.0", True), ("2000m", True), ("1.5", False)])
def test_the_api_server_takes_a_whole_gpu_quantity_in_any_spelling(
    control_plane: ControlPlane, quantity: str, taken: bool
) -> None:
    """What convert counts (#35): an extended resource must be a whole value, however the quantity is written."""
    container = {"name": "main", "image": "i", "resources": {"limits": {"nvidia.com/gpu": quantity}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}

    def post() -> Any:
        return control_plane.kube.request("POST", "/api/v1/namespaces/default/pods", pod, dryRun="All")

    if taken:
        post()
        return
    with pytest.raises(ApiError) as refused:
        post()
    assert refused.value.status == 422 and "must be an integer" in str(refused.value)
