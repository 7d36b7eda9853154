"""Our image, run the way the chart's sim-preset DaemonSet runs it, against the real control plane: podman starts
the container with the DaemonSet's own environment, arguments and mounts (manifests/overlays/sim, the chart
rendered), and `dradriver run` in it discovers the simulated node, publishes its ResourceSlices to the real API
server, creates its per-pod registration socket where the kubelet looks, answers /livez, and stops cleanly within
the pod's grace period on SIGTERM. What a real kubelet adds (registration, probes, prepare) is the node tests'."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.control_plane import ControlPlane, NodeKeeper, free_port
from support.image import IMAGE, REPO, VERSION, podman
from support.kube_rest import Kube

NODE = "gpu-image"
DAEMONSET = REPO / "manifests/overlays/sim/daemonset.yaml"


def pod_template() -> dict[str, Any]:
    [daemonset] = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    template: dict[str, Any] = daemonset["spec"]["template"]
    return template


def container_environment(container: dict[str, Any], pod_uid: str, metrics: str, kubeconfig: Path) -> list[str]:
    """The container's env as podman flags, downward-API values filled in as the kubelet would."""
    downward = {"spec.nodeName": NODE, "metadata.uid": pod_uid}
    flags = []
    for variable in container["env"]:
        value = variable.get("value")
        if value is None:
            value = downward[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        if variable["name"] == "DRADRIVER_METRICS_ADDRESS":
            value = metrics  # podman shares the host's network here: a free port, not the pod's :8080
        flags += ["--env", f"{variable['name']}={value}"]
    # In a pod the in-cluster service account is used; here the admin kubeconfig, mounted at its own path.
    return [*flags, "--env", f"DRADRIVER_KUBECONFIG={kubeconfig}"]


@pytest.fixture
def node(kube: Kube) -> Iterator[str]:
    keeper = NodeKeeper(kube, NODE)
    yield NODE
    keeper.stop()
    kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={NODE}")
    kube.delete("nodes", NODE)


def test_the_image_runs_as_the_sim_daemonset_against_the_real_api_server(
    node: str, control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    template = pod_template()
    [container] = template["spec"]["containers"]
    assert container["image"] == f"dradriver:{VERSION}"  # ours, here under podman's localhost/ name
    volumes = {v["name"]: v["hostPath"]["path"] for v in template["spec"]["volumes"]}
    host = {name: tmp_path / name for name in volumes}
    mounts = []
    for mount in container["volumeMounts"]:
        host[mount["name"]].mkdir()
        mounts += ["--volume", f"{host[mount['name']]}:{mount['mountPath']}"]
    pod_uid = str(uuid.uuid4())
    metrics = f"127.0.0.1:{free_port()}"
    name = f"dradriver-{pod_uid[:8]}"
    started = podman(
        tmp_path, "run", "--detach", "--name", name, "--network=host", "--privileged",
        "--volume", f"{control_plane.root}:{control_plane.root}:ro", *mounts,
        *container_environment(container, pod_uid, metrics, control_plane.kubeconfig),
        IMAGE, *container["args"],
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        slices = kube.wait(
            "the image's driver to publish the simulated node's slices",
            # Until every slice of the pool is there: the first one written may hold only counters, no devices.
            lambda: (
                [
                    s
                    for s in [kube.list("resourceslices", fieldSelector=f"spec.nodeName={node}")]
                    if s and sum(len(x["spec"].get("devices", [])) for x in s) > 0
                ]
                and kube.list("resourceslices", fieldSelector=f"spec.nodeName={node}")
            ),
            timeout=120,
        )
        assert {s["spec"]["driver"] for s in slices} == {"gpu.dradriver.dev"}
        assert sum(len(s["spec"].get("devices", [])) for s in slices) > 0
        registry = host["plugins-registry"]
        assert kube.wait(
            "the per-pod registration socket",
            lambda: [p.name for p in registry.iterdir() if pod_uid in p.name and p.is_socket()],
        )
        with urllib.request.urlopen(f"http://{metrics}/livez", timeout=10) as reply:
            assert reply.status == 200, json.loads(reply.read())
        stopped = podman(tmp_path, "stop", "--time", str(template["spec"]["terminationGracePeriodSeconds"]), name,
                         timeout=60)  # fmt: skip
        assert stopped.returncode == 0, stopped.stderr
        exited = podman(tmp_path, "inspect", "--format", "{{.State.ExitCode}}", name)
        logs = podman(tmp_path, "logs", name).stdout + podman(tmp_path, "logs", name).stderr
        assert exited.stdout.strip() == "0", logs
        assert "Traceback" not in logs, logs
    finally:
        (control_plane.logs / "dradriver-image.log").write_text(podman(tmp_path, "logs", name).stderr)
        podman(tmp_path, "rm", "--force", name)
