"""Every example claim, end to end through the real scheduler: `explain --pod` says whether it fits before the
scheduler sees it, the scheduler agrees, our plugin prepares what the scheduler allocated (through the kubelet
stand-in), the CDI ids resolve to spec files, and unprepare cleans up. Crafted claims that must not fit are
refused by both; where only one choice exists, offline `explain` picks the device the scheduler picked."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_node import DRIVER, SimNode, remove_nodes
from support.cluster_pods import NAMESPACE, GatedPod, allocated_devices, claim_template, kubectl, kubectl_apply
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.cli.explain import EXIT_DOES_NOT_FIT, EXIT_FITS
from dradriver.cli.main import main
from dradriver.plugin.kubeletplugin.kubelet_client import Claim

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "claims").glob("*.yaml"))


def header(example: Path) -> tuple[str, str | None, tuple[str, ...]]:
    """An example's "# Profile: NAME [--mig-mode MODE] [FLAG VALUE...]" header: the profile, the MIG mode (None:
    any) and the driver flags it needs beyond them."""
    line = next(line for line in example.read_text().splitlines() if line.startswith("# Profile:"))
    words = line.removeprefix("# Profile:").split()
    if "(any" in words:
        return words[0], None, ()
    rest = words[1:]
    mode = None
    if "--mig-mode" in rest:
        at = rest.index("--mig-mode")
        mode = rest[at + 1]
        rest = rest[:at] + rest[at + 2 :]
    return words[0], mode, tuple(rest)


def node_for(example: Path, nodes: dict[str, SimNode]) -> SimNode:
    """The simulated node an example is written for (its header), among the session's and the module's own."""
    profile, mode, extra = header(example)
    for node in nodes.values():
        if node.profile == profile and mode in (None, node.mig_mode) and node.extra == extra:
            return node
    raise AssertionError(f"{example.name}: no simulated node for {header(example)!r}; add one to NODES in conftest.py")


@pytest.fixture(scope="module")
def example_nodes(nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube) -> Iterator[dict[str, SimNode]]:
    """The session's nodes, plus one of this module's own for each header that needs driver flags of its own
    (e.g. --fabric-manager-partitions true), removed again at the end of the module."""
    own: dict[str, SimNode] = {}
    for example in EXAMPLES:
        profile, mode, extra = header(example)
        if extra and not any(n.profile == profile and n.extra == extra for n in own.values()):
            name = f"gpu-example-{len(own)}"
            own[name] = SimNode.start(kube, control_plane.kubeconfig, control_plane.root / name, name,
                                      profile=profile, mig_mode=mode or "none", extra=extra)  # fmt: skip
    try:
        yield {**nodes, **own}
    finally:
        remove_nodes(own.values(), kube, control_plane.logs)


def status_devices(kube: Kube, claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    fresh = kube.get("resourceclaims", claim["metadata"]["name"], NAMESPACE)
    entries = fresh.get("status", {}).get("devices") or []
    return sorted((e["driver"], e["pool"], e["device"]) for e in entries if e["driver"] == DRIVER)


def cdi_ids_on_disk(cdi_dir: Path) -> set[str]:
    """Fully qualified CDI device names (vendor/class=name) of every spec file in ``cdi_dir``, as a CDI
    registry resolves them."""
    found = set()
    for path in cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        found |= {f"{spec['kind']}={device['name']}" for device in spec.get("devices", [])}
    return found


def prepare_and_unprepare(node: SimNode, pod: GatedPod) -> None:
    claim = pod.claim()
    allocated = allocated_devices(claim)
    assert allocated and all(driver == DRIVER and pool == node.name for driver, pool, _ in allocated), allocated
    prepared = node.kubelet.prepare(pod.get())
    result = prepared[claim["metadata"]["uid"]]
    assert result.error == "", result.error
    assert sorted(d["device_name"] for d in result.devices) == sorted(device for _, _, device in allocated)
    on_disk = cdi_ids_on_disk(node.cdi_dir)
    for device in result.devices:
        assert device["pool_name"] == node.name
        assert device["cdi_device_ids"] and set(device["cdi_device_ids"]) <= on_disk, (device, on_disk)
    # The driver reports the prepared devices in status.devices, through the real status subresource.
    kube = node.kubelet.kube
    kube.wait("status.devices after prepare", lambda: status_devices(kube, claim) == sorted(allocated))
    uid = claim["metadata"]["uid"]
    assert node.kubelet.unprepare([Claim(NAMESPACE, claim["metadata"]["name"], uid)]) == {uid: ""}
    kube.wait("status.devices cleared at unprepare", lambda: status_devices(kube, claim) == [])
    assert not [p for p in node.cdi_dir.glob("*.json") if uid in p.name], "the claim's CDI spec outlived unprepare"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_scheduled_prepared_and_cleaned_up(
    example: Path, example_nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube
) -> None:
    [template] = [doc for doc in yaml.safe_load_all(example.read_text()) if doc]
    kubectl_apply(kubectl(), control_plane.kubeconfig, example)
    node = node_for(example, example_nodes)
    pod = GatedPod(kube, f"example-{example.stem}", template["metadata"]["name"], node=node.name).create()
    try:
        code, explained = pod.explain(control_plane.kubeconfig)
        assert code == EXIT_FITS, explained
        assert pod.release() == "scheduled", pod.get().get("status")
        assert pod.get()["spec"]["nodeName"] == node.name
        prepare_and_unprepare(node, pod)
    finally:
        pod.delete()


def whole_gpus(count: int, selector: str | None = None, *, match: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.dradriver.dev", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}
    if match:
        spec["devices"]["constraints"] = [{"matchAttribute": match}]
    return spec


def mig(count: int, profile: str, *, same_parent: bool = False) -> dict[str, Any]:
    exactly = {
        "deviceClassName": "mig.dradriver.dev",
        "count": count,
        "selectors": [{"cel": {"expression": f'device.attributes["gpu.dradriver.dev"].profile == "{profile}"'}}],
    }
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "migs", "exactly": exactly}]}}
    if same_parent:
        spec["devices"]["constraints"] = [{"matchAttribute": "gpu.dradriver.dev/parentUUID"}]
    return spec


PRODUCT = 'device.attributes["gpu.dradriver.dev"].productName == "{}"'
# Claims no simulated node can satisfy, each for a different reason the scheduler must see.
MUST_NOT_FIT = {
    "nine-gpus": whole_gpus(9),  # the largest node has eight
    "a-b200": whole_gpus(1, PRODUCT.format("NVIDIA B200")),
    "three-bridged-h100-nvl": whole_gpus(3, PRODUCT.format("NVIDIA H100 NVL"), match="gpu.dradriver.dev/nvlinkDomain"),
    "three-3g40gb-on-one-a100": mig(3, "3g.40gb", same_parent=True),  # shared counters allow two per GPU
    "two-l4-on-one-pcie-root-and-numa-0": whole_gpus(
        2,
        PRODUCT.format("NVIDIA L4") + ' && device.attributes["resource.kubernetes.io"].numaNode == 0',
    ),
}


def apply_template(control_plane: ControlPlane, tmp_path: Path, name: str, spec: dict[str, Any]) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(claim_template(name, spec)))
    kubectl_apply(kubectl(), control_plane.kubeconfig, path)


@pytest.mark.parametrize("name", list(MUST_NOT_FIT))
def test_explain_and_the_scheduler_agree_a_claim_does_not_fit(
    name: str, nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    apply_template(control_plane, tmp_path, name, MUST_NOT_FIT[name])
    pod = GatedPod(kube, f"nofit-{name}", name).create()
    try:
        code, explained = pod.explain(control_plane.kubeconfig)
        assert code == EXIT_DOES_NOT_FIT, explained
        assert pod.release() == "unschedulable"
        assert not allocated_devices(pod.claim())
    finally:
        pod.delete()


# Claims with exactly one possible allocation in the whole cluster: (claim spec, node).
FORCED = {
    "the-one-3g20gb": (mig(1, "3g.20gb"), "gpu-mixed"),
    "both-l4": (whole_gpus(2, PRODUCT.format("NVIDIA L4")), "gpu-mixed"),
    "all-four-h100-nvl": (whole_gpus(4, PRODUCT.format("NVIDIA H100 NVL")), "gpu-nvl"),
}


def offline_choice(tmp_path: Path, kube: Kube, name: str) -> set[str]:
    """The devices offline `dradriver explain` allocates for template ``name`` from the cluster's slices."""
    slices = tmp_path / "slices.yaml"
    slices.write_text(
        yaml.safe_dump_all(
            [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **s} for s in kube.list("resourceslices")]
        )
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", str(tmp_path / f"{name}.yaml"), "--slices", str(slices), "-o", "json"])
    assert code == EXIT_FITS, out.getvalue()
    [outcome] = json.loads(out.getvalue())["claims"]
    return {result["device"] for result in outcome["report"]["allocation"]["devices"]["results"]}


@pytest.mark.parametrize("name", list(FORCED))
def test_offline_explain_picks_the_device_the_scheduler_picked_when_there_is_one_choice(
    name: str, nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    spec, node = FORCED[name]
    apply_template(control_plane, tmp_path, name, spec)
    expected = offline_choice(tmp_path, kube, name)
    pod = GatedPod(kube, f"forced-{name}", name).create()
    try:
        code, explained = pod.explain(control_plane.kubeconfig)
        assert code == EXIT_FITS, explained
        assert pod.release() == "scheduled"
        assert pod.get()["spec"]["nodeName"] == node
        assert {device for _, _, device in allocated_devices(pod.claim())} == expected
    finally:
        pod.delete()


def test_a_device_taint_rule_keeps_the_scheduler_and_explain_away_and_a_toleration_lets_a_pod_through(
    nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    rule = kube.create(
        "devicetaintrules",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"generateName": "maintenance-"},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": "gpu-nvl"},
                "taint": {"key": "dradriver.dev/maintenance", "value": "true", "effect": "NoSchedule"},
            },
        },
    )
    try:
        spec = whole_gpus(4, PRODUCT.format("NVIDIA H100 NVL"))
        apply_template(control_plane, tmp_path, "tainted-nvl", spec)
        pod = GatedPod(kube, "taint-refused", "tainted-nvl").create()
        try:
            code, explained = pod.explain(control_plane.kubeconfig)
            assert code == EXIT_DOES_NOT_FIT, explained
            assert pod.release() == "unschedulable"
        finally:
            pod.delete()
        spec["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": "dradriver.dev/maintenance", "operator": "Exists", "effect": "NoSchedule"}
        ]
        apply_template(control_plane, tmp_path, "tolerating-nvl", spec)
        pod = GatedPod(kube, "taint-tolerated", "tolerating-nvl").create()
        try:
            code, explained = pod.explain(control_plane.kubeconfig)
            assert code == EXIT_FITS, explained
            assert pod.release() == "scheduled"
        finally:
            pod.delete()
    finally:
        kube.delete("devicetaintrules", rule["metadata"]["name"])


def test_an_unhealthy_devices_taint_keeps_the_scheduler_away_and_a_toleration_lets_a_pod_through(
    control_plane: ControlPlane, kube: Kube, tmp_path: Path, nodes: dict[str, SimNode]
) -> None:
    name = "gpu-sick"
    node = SimNode.start(
        kube, control_plane.kubeconfig, control_plane.root / name, name, profile="h100-nvl-pairs", mig_mode="none"
    )
    try:
        sick = "gpu-0000-17-00-0"
        sim = [
            "sim",
            "--sim-profile",
            "h100-nvl-pairs",
            "--node-name",
            name,
            "--sim-state",
            str(node.root / "sim.json"),
        ]
        # XID 62 (a micro-controller halt): fatal, and the GPU keeps answering (79 would take it off the bus).
        assert main([*sim, "xid", "0000:17:00.0", "62"]) == 0

        def taints() -> list[dict[str, Any]]:
            return [
                t
                for s in kube.list("resourceslices", fieldSelector=f"spec.nodeName={name}")
                for d in s["spec"].get("devices") or []
                if d["name"] == sick
                for t in d.get("taints") or []
            ]

        [taint] = kube.wait(f"the XID taint on {sick}", taints)
        assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.dradriver.dev/xid", "62", "NoSchedule")
        spec = whole_gpus(1, 'device.attributes["resource.kubernetes.io"].pciBusID == "0000:17:00.0"')
        apply_template(control_plane, tmp_path, "the-sick-gpu", spec)
        pod = GatedPod(kube, "sick-refused", "the-sick-gpu", node=name).create()
        try:
            code, explained = pod.explain(control_plane.kubeconfig)
            assert code == EXIT_DOES_NOT_FIT, explained
            assert pod.release() == "unschedulable"
        finally:
            pod.delete()
        spec["devices"]["requests"][0]["exactly"]["tolerations"] = [
            {"key": "gpu.dradriver.dev/xid", "operator": "Exists", "effect": "NoSchedule"}
        ]
        apply_template(control_plane, tmp_path, "the-sick-gpu-tolerated", spec)
        pod = GatedPod(kube, "sick-tolerated", "the-sick-gpu-tolerated", node=name).create()
        try:
            code, explained = pod.explain(control_plane.kubeconfig)
            assert code == EXIT_FITS, explained
            assert pod.release() == "scheduled"
            assert allocated_devices(pod.claim()) == [(DRIVER, name, sick)]
        finally:
            pod.delete()
    finally:
        (control_plane.logs / f"dradriver-{name}.log").write_text(node.driver.log)
        node.stop()
        kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={name}")
        kube.delete("nodes", name)


def test_a_selector_that_fails_at_runtime_is_an_error_for_both(
    nodes: dict[str, SimNode], control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    # No device has this attribute: CEL fails with "no such key", and the scheduler errors rather than decides.
    spec = whole_gpus(1, 'device.attributes["gpu.dradriver.dev"].noSuchAttribute == "x"')
    apply_template(control_plane, tmp_path, "runtime-error", spec)
    pod = GatedPod(kube, "cel-runtime-error", "runtime-error").create()
    try:
        code, explained = pod.explain(control_plane.kubeconfig)
        assert code == EXIT_DOES_NOT_FIT, explained
        [claim] = explained["claims"]
        assert "no such key" in json.dumps(claim), claim
        assert pod.release() == "error"
    finally:
        pod.delete()
