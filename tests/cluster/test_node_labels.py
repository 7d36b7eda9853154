"""GPU Feature Discovery's labels kept by `dradriver run --node-labels gfd` on its Node in the real API server:
they appear, follow the hardware (a lost GPU, MIG mode and devices, a driver upgrade), are not rewritten on an
idle node, go with `--node-labels none` and `dradriver node-labels remove`, and other labels stay.
(test_node_labels_policy.py checks what the admission policy lets the plugin's own token change.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_node import SimNode
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.cli.main import main
from dradriver.driver.publish.node_labels import is_owned
from dradriver.sim.profiles import builtin_profile_names

TIMEOUT = 60.0
ANNOTATION = "gpu.dradriver.dev/node-labels"
GFD = ("--node-labels", "gfd", "--node-labels-mig-strategy", "mixed", "--rescan-interval", "1")
PROFILE = "dgx-a100-80gb"


@pytest.fixture
def start_node(control_plane: ControlPlane, kube: Kube) -> Iterator[Callable[[str], SimNode]]:
    started: list[SimNode] = []

    def start(name: str) -> SimNode:
        node = SimNode.start(
            kube,
            control_plane.kubeconfig,
            control_plane.root / name,
            name,
            profile=PROFILE,
            mig_mode="static",
            extra=GFD,
        )
        started.append(node)
        return node

    yield start
    for node in started:
        (control_plane.logs / f"dradriver-{node.name}.log").write_text(node.driver.log)
        node.stop()
        # No garbage collector runs here, so the Node's owner reference does not take the slices with it.
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={node.name}")
        kube.delete("nodes", node.name)


def labels_of(kube: Kube, node: str) -> dict[str, str]:
    return dict(kube.get("nodes", node)["metadata"].get("labels") or {})


def annotation_of(kube: Kube, node: str) -> str | None:
    return (kube.get("nodes", node)["metadata"].get("annotations") or {}).get(ANNOTATION)


def wait_label(kube: Kube, node: str, key: str, value: str | None) -> dict[str, str]:
    """The Node's labels once ``key`` is ``value`` (None: absent)."""
    return kube.wait(
        f"{key}={value} on {node}", lambda: (labels := labels_of(kube, node)).get(key) == value and labels, TIMEOUT
    )


def sim(node: SimNode, *args: str) -> None:
    common = [
        "sim",
        "--sim-profile",
        node.profile,
        "--node-name",
        node.name,
        "--sim-state",
        str(node.root / "sim.json"),
    ]
    assert main([*common, *args]) == 0


def test_labels_appear_follow_the_gpus_and_are_not_rewritten_on_an_idle_node(start_node, kube: Kube) -> None:
    node = start_node("labels-follow")
    labels = wait_label(kube, node.name, "nvidia.com/gpu.count", "8")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["kubernetes.io/hostname"] == node.name  # the kubelet's label stays
    assert annotation_of(kube, node.name) == ",".join(sorted(k for k in labels if is_owned(k)))

    sim(node, "lose", "0000:07:00.0")
    wait_label(kube, node.name, "nvidia.com/gpu.count", "7")

    # MIG mode on (pending until the reset on Ampere), then a MIG device: mixed strategy labels its profile.
    sim(node, "mig-mode", "0000:0f:00.0", "enable")
    sim(node, "reset", "0000:0f:00.0")
    sim(node, "mig-create", "0000:0f:00.0", "1g.10gb")
    labels = wait_label(kube, node.name, "nvidia.com/mig-1g.10gb.count", "1")
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert "nvidia.com/mig-1g.10gb.count" in (annotation_of(kube, node.name) or "").split(",")

    # An XID makes the driver rescan at once and republish the GPU tainted; the labels stay as they were, unwritten.
    before = kube.get("nodes", node.name)["metadata"]["resourceVersion"]
    sim(node, "xid", "0000:47:00.0", "62")
    kube.wait("the XID taint in the slices", lambda: _tainted(kube, node.name), TIMEOUT)
    assert kube.get("nodes", node.name)["metadata"]["resourceVersion"] == before
    assert node.driver.log.count('"msg": "node labels written') == 3, node.driver.log


def _tainted(kube: Kube, node: str) -> bool:
    slices = kube.list("resourceslices", fieldSelector=f"spec.nodeName={node}")
    return any(d.get("taints") for s in slices for d in s["spec"].get("devices") or [])


def test_a_driver_upgrade_relabels_and_none_removes_only_what_the_driver_wrote(
    start_node, kube: Kube, tmp_path: Path
) -> None:
    node = start_node("labels-upgrade")
    wait_label(kube, node.name, "nvidia.com/cuda.driver-version.full", "580.65.06")
    kube.patch("nodes", node.name, {"metadata": {"labels": {"team": "a"}}})

    assert PROFILE in builtin_profile_names()
    upgraded = yaml.safe_load(_builtin_profile_text(PROFILE))
    upgraded["driverVersion"] = "590.10.01"
    (tmp_path / "upgraded.yaml").write_text(yaml.safe_dump(upgraded))
    node.profile = str(tmp_path / "upgraded.yaml")
    node.restart_driver()
    labels = wait_label(kube, node.name, "nvidia.com/cuda.driver-version.full", "590.10.01")
    assert labels["nvidia.com/cuda.driver-version.major"] == "590"

    node.extra = ("--node-labels", "none")
    node.restart_driver()
    kube.wait("the driver's labels to go", lambda: annotation_of(kube, node.name) is None, TIMEOUT)
    labels = labels_of(kube, node.name)
    assert not [k for k in labels if is_owned(k)]
    assert labels["team"] == "a"

    # Someone else's label under our prefix, without our annotation, is none of ours to remove.
    kube.patch("nodes", node.name, {"metadata": {"labels": {"nvidia.com/gpu.product": "theirs"}}})
    node.restart_driver()
    assert labels_of(kube, node.name)["nvidia.com/gpu.product"] == "theirs"
    assert '"msg": "node labels removed' not in node.driver.log


def _builtin_profile_text(name: str) -> str:
    from importlib.resources import files

    return (files("dradriver.sim") / "data" / "nodes" / f"{name}.yaml").read_text()


def test_node_labels_remove_all_nodes_takes_ours_off_every_node(
    start_node, kube: Kube, control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [start_node("labels-remove-a"), start_node("labels-remove-b")]
    for node in nodes:
        wait_label(kube, node.name, "nvidia.com/gpu.count", "8")
        kube.patch("nodes", node.name, {"metadata": {"labels": {"team": "a"}}})
        node.driver.stop()  # as at helm uninstall: the plugin pods are gone when the hook runs
    assert main(["node-labels", "remove", "--all-nodes", "--kubeconfig", str(control_plane.kubeconfig)]) == 0
    out = capsys.readouterr().out
    for node in nodes:
        assert f"node/{node.name}: removed " in out
        labels: dict[str, Any] = labels_of(kube, node.name)
        assert not [k for k in labels if is_owned(k)]
        assert labels["team"] == "a"
        assert annotation_of(kube, node.name) is None
