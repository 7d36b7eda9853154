"""GPU sharing through the real scheduler: consumable shares (KEP-5075) pack two claims onto one GPU of a node
run with `--gpu-sharing consumable`, and each prepared claim gets its own MPS daemon with its share as limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_node import SimNode
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.plugin.kubeletplugin.kubelet_client import Claim

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-sharing"
WRAPPED = "DRADRIVER_TEST_WRAPPED_DAEMON"


@pytest.fixture(scope="module")
def sharing_node(control_plane: ControlPlane, kube: Kube, device_classes: None) -> Iterator[SimNode]:
    """A node of its own (the session's nodes publish exclusive GPUs)."""
    root = control_plane.root / NODE
    node = SimNode.start(
        kube,
        control_plane.kubeconfig,
        root,
        NODE,
        profile="mixed",
        mig_mode="none",
        # As the DaemonSet's nsenter/systemd-run wrapper, one that marks the daemon and execs it.
        extra=("--gpu-sharing", "consumable", "--mps-daemon-wrapper", f"env {WRAPPED}=1"),
    )
    try:
        yield node
    finally:
        (control_plane.logs / f"dradriver-{NODE}.log").write_text(node.driver.log)
        node.stop()
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
        kube.delete("nodes", NODE)


def test_two_claims_share_one_gpu_each_with_its_mps_limits(sharing_node: SimNode, kube: Kube) -> None:
    [template] = [
        d for d in yaml.safe_load_all((REPO / "examples/scenarios/15-consumable-shares.yaml").read_text())
        if d and d["kind"] == "ResourceClaimTemplate"
    ]  # fmt: skip
    template["metadata"] = {"name": "sharing-test", "namespace": NAMESPACE}
    kube.create("resourceclaimtemplates", template, NAMESPACE)
    pods = [GatedPod(kube, f"sharing-{i}", "sharing-test", node=NODE).create() for i in range(2)]
    try:
        assert [p.release() for p in pods] == ["scheduled", "scheduled"]
        devices = [allocated_devices(p.claim()) for p in pods]
        assert len(devices[0]) == 1 and devices[0] == devices[1], devices  # packed onto one GPU
        for pod in pods:
            result = sharing_node.kubelet.prepare(pod.get())[pod.claim()["metadata"]["uid"]]
            assert result.error == "", result.error
        for pod in pods:
            uid = pod.claim()["metadata"]["uid"]
            [spec_path] = [p for p in sharing_node.cdi_dir.glob("*.json") if uid in p.name]
            spec: dict[str, Any] = json.loads(spec_path.read_text())
            edits = spec["devices"][0]["containerEdits"]
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
            [pipe] = [m["hostPath"] for m in edits["mounts"] if m["containerPath"] == "/tmp/nvidia-mps"]
            assert (Path(pipe) / "control").exists()  # the claim's daemon serves
            log = (Path(pipe).parent / "log" / "control.log").read_text()
            assert "set_default_active_thread_percentage 25" in log
            assert "set_default_device_pinned_mem_limit GPU-" in log and " 10240M" in log
        # The daemons are not the plugin's children in its process group: killing the plugin spares them, and the
        # next instance re-adopts them (each log shows one start) instead of starting new ones.
        sharing_node.restart_driver(signal.SIGKILL)
        for pod in pods:
            uid = pod.claim()["metadata"]["uid"]
            [spec_path] = [p for p in sharing_node.cdi_dir.glob("*.json") if uid in p.name]
            edits = json.loads(spec_path.read_text())["devices"][0]["containerEdits"]
            [pipe] = [m["hostPath"] for m in edits["mounts"] if m["containerPath"] == "/tmp/nvidia-mps"]
            asked = subprocess.run(
                [sys.executable, "-m", "dradriver.sim.mps_standin"],
                input="get_default_active_thread_percentage\n",
                env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe},
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert asked.returncode == 0 and asked.stdout.strip() == "25.0", asked
            assert (Path(pipe).parent / "log" / "control.log").read_text().count("Startup") == 1
            # the serving daemon is the one the wrapper started
            pid = json.loads((Path(pipe).parent / "daemon.json").read_text())["pid"]
            assert f"{WRAPPED}=1".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        claims = [Claim(NAMESPACE, p.claim()["metadata"]["name"], p.claim()["metadata"]["uid"]) for p in pods]
        assert set(sharing_node.kubelet.unprepare(claims).values()) == {""}
    finally:
        for pod in pods:
            pod.delete()
        kube.delete("resourceclaimtemplates", "sharing-test", NAMESPACE)
