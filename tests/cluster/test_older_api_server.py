"""Real kube-apiservers of Kubernetes 1.33 and 1.32 (scripts/build-older-apiservers): no resource.k8s.io/v1, 1.33
serves v1beta2 and v1beta1, 1.32 v1beta1. `dradriver run`, told nothing about the release, finds the newest version by
API discovery and publishes every simulated node's slices through it (on 1.33 dynamic MIG's shared counters too,
with the alpha gate DRAPartitionableDevices they need there; 1.32 refuses dynamic MIG at start); they read back
equal through every version served; deleted and edited slices are repaired; a 1.33 server serving only v1beta1
gets them in v1beta1; a claim is prepared as a kubelet of that release asks and its status written; the chart's
DeviceClasses for 1.32 and 1.33 are stored as rendered and a real install renders them in the served version; a
1.33 server without the counters gate gets no device it could not keep apart; and one with DRA off, its default,
is refused by the driver and by the chart with the fix; where the server keeps no device taints (1.32, and 1.33
without its alpha gate) an unhealthy GPU is withdrawn from the slices until it heals. There is no older scheduler
here: allocation on the real scheduler is the 1.37 control plane's (test_slices.py and the rest of tests/cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import required
from support.cluster_fixtures import running_plane
from support.cluster_node import DRIVER, DriverRun, SimNode
from support.cluster_pods import kubectl
from support.control_plane import BUILD_SCRIPT, OLDER_BUILD_SCRIPT, REPO, ControlPlane, binaries_dir, older_apiserver
from support.helm import CHART, RELEASE, run_helm
from support.kube_rest import ApiError, Kube

from dradriver.cli.main import main
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs, shape_for
from dradriver.gpu.backend import open_gpu_backend
from dradriver.gpu.inventory import MigMode, discover
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from dradriver.sim.profiles import builtin_profile_names

TIMEOUT = 90.0
GROUP = "/apis/resource.k8s.io"
# DRA is beta in 1.33 and off by default: its gate, its API versions, and the alpha gate of shared counters.
GATES = "DynamicResourceAllocation=true,DRAPartitionableDevices=true"
BOTH_VERSIONS = "resource.k8s.io/v1beta2=true,resource.k8s.io/v1beta1=true"
# Who wrote which ResourceSlice through which version: the audit log, one JSON event per line.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Metadata
  resources: [{group: resource.k8s.io, resources: [resourceslices, deviceclasses, resourceclaims/status]}]
  omitStages: [RequestReceived]
- level: None
"""


def start_older(name: str, runtime_config: str, feature_gates: str, release: str = "1.33") -> Iterator[ControlPlane]:
    """etcd (the 1.37 control plane's) and the kube-apiserver of ``release`` with an audit log; logs kept on
    failure."""
    apiserver, etcd = older_apiserver(release), binaries_dir() / "etcd"
    missing = [str(p) for p in (apiserver, etcd) if not os.access(p, os.X_OK)]
    if missing:
        required.need(
            f"the {release} API server",
            f"the {release} API server tests run it; {' and '.join(missing)} not built",
            f"build them with `{OLDER_BUILD_SCRIPT.relative_to(REPO)}` and `{BUILD_SCRIPT.relative_to(REPO)}` "
            "(`scripts/test` does)",
            tier=required.CLUSTER,
        )
    root = Path(tempfile.mkdtemp(prefix=f"dra-{release.replace('.', '')}-{name}-", dir="/tmp"))
    policy = root / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    plane = ControlPlane(
        binaries_dir(),
        root,
        apiserver=apiserver,
        runtime_config=runtime_config,
        feature_gates=feature_gates,
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={root / 'logs' / 'audit.log'}"),
    )
    yield from running_plane(plane, ControlPlane.start_api_server, f"{release} API server tests")


@pytest.fixture(scope="module")
def beta2() -> Iterator[ControlPlane]:
    """1.33 with DRA turned on as its documentation says: both beta versions, the DRA gate (and shared counters)."""
    yield from start_older("beta2", BOTH_VERSIONS, GATES)


@pytest.fixture(scope="module")
def beta1_only() -> Iterator[ControlPlane]:
    """1.33 serving only v1beta1 (as 1.32 does)."""
    yield from start_older("beta1", "resource.k8s.io/v1beta1=true", GATES)


@pytest.fixture(scope="module")
def no_counters() -> Iterator[ControlPlane]:
    """1.33 with DRA on but not the alpha gate of shared counters (DRAPartitionableDevices): it drops them."""
    yield from start_older("nocounters", BOTH_VERSIONS, "DynamicResourceAllocation=true")


@pytest.fixture(scope="module")
def k132() -> Iterator[ControlPlane]:
    """1.32 with DRA turned on: v1beta1 (its only version) and the DRA gate; no other DRA gate."""
    yield from start_older("k132", "resource.k8s.io/v1beta1=true", "DynamicResourceAllocation=true", release="1.32")


@pytest.fixture(scope="module")
def dra_off() -> Iterator[ControlPlane]:
    """1.33 as it starts by default: no resource.k8s.io at all."""
    yield from start_older("off", "", "")


# --- reading back ------------------------------------------------------------------------------------------------


def served(kube: Kube, version: str, node: str) -> list[dict[str, Any]]:
    """The node's slices of our driver, read through ``version`` of resource.k8s.io, by name."""
    found = kube.request(
        "GET", f"{GROUP}/{version}/resourceslices", fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}"
    )
    assert found["apiVersion"] == f"resource.k8s.io/{version}"
    return sorted(found["items"], key=lambda s: s["metadata"]["name"])


def specs(slices: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    """The devices/sharedCounters part of each slice, devices in the v1 shape: v1beta1 nests a device's fields
    under ``basic`` (asserted here, then undone)."""
    out = []
    for item in slices:
        spec = {k: item["spec"][k] for k in ("devices", "sharedCounters") if item["spec"].get(k)}
        if version == "v1beta1" and "devices" in spec:
            assert all(set(d) == {"name", "basic"} for d in spec["devices"]), spec["devices"][0]
            spec["devices"] = [{"name": d["name"], **d["basic"]} for d in spec["devices"]]
        out.append(spec)
    return out


def intended(node: SimNode, release: str = "1.33") -> list[dict[str, Any]]:
    """What the driver means to publish for the node's simulated hardware on ``release``."""
    gpulib, _ = open_gpu_backend("sim", sim_profile=node.profile, node_name=node.name, sim_state=node.root / "sim.json")
    settings = SliceSettings(driver=DRIVER, mig_mode=MigMode(node.mig_mode), shape=shape_for(release))
    return [{k: v for k, v in spec.items() if v} for spec in build_slice_specs(discover(gpulib), settings)]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def audit(plane: ControlPlane) -> list[str]:
    log = plane.logs / "audit.log"
    return log.read_text().splitlines() if log.exists() else []


def driver_writes(plane: ControlPlane, since: int = 0) -> set[tuple[str, str]]:
    """(verb, API version) of every ResourceSlice request the driver made after the first ``since`` audit events
    (the driver's user agent; the tests' own client is urllib3's)."""
    seen = set()
    for line in audit(plane)[since:]:
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "resourceslices" and event.get("userAgent", "").startswith("dradriver/"):
            seen.add((event["verb"], ref.get("apiVersion", "")))
    return seen


def start_node(plane: ControlPlane, name: str, profile: str, mig_mode: str) -> SimNode:
    """A simulated node whose `dradriver run` is given no --kubernetes-version: it reads /version itself."""
    return SimNode.start(
        plane.kube, plane.kubeconfig, plane.root / name, name, profile=profile, mig_mode=mig_mode, version=""
    )


def stop_node(plane: ControlPlane, node: SimNode) -> None:
    (plane.logs / f"dradriver-{node.name}.log").write_text(node.driver.log)
    node.stop()
    # No garbage collector runs here: the Node's owner reference does not take the slices with it.
    for item in served(plane.kube, "v1beta1", node.name):
        plane.kube.request("DELETE", f"{GROUP}/v1beta1/resourceslices/{item['metadata']['name']}")
    plane.kube.delete("nodes", node.name)


def wait_published(plane: ControlPlane, node: SimNode, version: str, want: list[dict[str, Any]]) -> None:
    plane.kube.wait(
        f"the slices of {node.name} ({node.profile}, MIG {node.mig_mode}) read through {version}",
        lambda: canonical(specs(served(plane.kube, version, node.name), version)) == canonical(want),
        TIMEOUT,
    )


# --- the driver ----------------------------------------------------------------------------------------------------


def test_discovery_on_the_1_33_server_lists_the_two_beta_versions(beta2: ControlPlane) -> None:
    version = beta2.kube.request("GET", "/version")
    assert (version["major"], version["minor"]) == ("1", "33")
    group = beta2.kube.request("GET", GROUP)
    assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
    assert group["preferredVersion"]["version"] == "v1beta2"


def start_nodes(plane: ControlPlane, profile: str, modes: list[str]) -> list[SimNode]:
    """One node per MIG mode of ``profile``, started side by side (driver processes start faster together)."""
    nodes: list[SimNode] = []
    errors: list[BaseException] = []

    def start(mode: str) -> None:
        try:
            nodes.append(start_node(plane, f"{profile}-{mode}", profile, mode))
        except BaseException as err:  # raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=start, args=(mode,)) for mode in modes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for node in nodes:
            stop_node(plane, node)
        raise errors[0]
    return nodes


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_simulated_node_is_published_through_v1beta2_and_reads_back_equal_in_both_versions(
    beta2: ControlPlane, profile: str
) -> None:
    mark = len(audit(beta2))
    nodes = start_nodes(beta2, profile, [mode.value for mode in MigMode])
    try:
        for node in nodes:
            want = intended(node)
            assert want, node.name
            wait_published(beta2, node, "v1beta2", want)
            wait_published(beta2, node, "v1beta1", want)
            assert "detected Kubernetes version=1.33" in node.driver.log
            assert '"level": "error"' not in node.driver.log, node.driver.log
        counters = [n for n in nodes if any(s.get("sharedCounters") for s in intended(n))]
        if profile in ("dgx-a100-80gb", "mixed"):
            assert counters, "dynamic MIG published no shared counters"
    finally:
        for node in nodes:
            stop_node(beta2, node)
    writes = driver_writes(beta2, mark)
    assert ("create", "v1beta2") in writes
    assert not {w for w in writes if w[1] != "v1beta2"}, writes


def test_deleted_and_edited_slices_are_repaired_through_v1beta2(beta2: ControlPlane) -> None:
    kube, mark = beta2.kube, len(audit(beta2))
    node = start_node(beta2, "repair", "dgx-a100-80gb", "dynamic")
    try:
        want = intended(node)
        wait_published(beta2, node, "v1beta2", want)
        first, *_ = served(kube, "v1beta2", node.name)

        # An admin deletes a slice: the driver's watch (through v1beta2) sees it, the slice comes back.
        kube.request("DELETE", f"{GROUP}/v1beta2/resourceslices/{first['metadata']['name']}")
        wait_published(beta2, node, "v1beta2", want)

        # Someone rewrites a slice through v1beta1: the driver puts its own back (an update).
        victim = served(kube, "v1beta1", node.name)[-1]
        victim["spec"]["devices"] = victim["spec"]["devices"][:1]
        kube.request("PUT", f"{GROUP}/v1beta1/resourceslices/{victim['metadata']['name']}", victim)
        wait_published(beta2, node, "v1beta2", want)

        # A restart, SIGKILL included, keeps the same slices under the same names.
        before = [s["metadata"]["name"] for s in served(kube, "v1beta2", node.name)]
        node.restart_driver(signal.SIGKILL)
        wait_published(beta2, node, "v1beta2", want)
        assert [s["metadata"]["name"] for s in served(kube, "v1beta2", node.name)] == before

        # Fewer devices (dynamic MIG → whole GPUs only): the driver deletes the slices it no longer needs.
        node.driver.stop()
        node.mig_mode = "none"
        node.driver = DriverRun(node.root, node.name, node.kubeconfig, profile=node.profile, mig_mode="none",
                                version="")  # fmt: skip
        wait_published(beta2, node, "v1beta2", intended(node))
    finally:
        stop_node(beta2, node)
    writes = driver_writes(beta2, mark)
    assert {("create", "v1beta2"), ("update", "v1beta2"), ("delete", "v1beta2")} <= writes, writes
    assert not {w for w in writes if w[1] != "v1beta2"}, writes


def claim_body(version: str, name: str) -> dict[str, Any]:
    """A one-GPU ResourceClaim in ``version``'s shape (v1beta1 has the request's fields beside its name)."""
    request: dict[str, Any] = {"name": "gpu"}
    exactly = {"deviceClassName": "gpu.dradriver.dev", "allocationMode": "ExactCount", "count": 1}
    request.update(exactly if version == "v1beta1" else {"exactly": exactly})
    config = {"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "gpu.dradriver.dev/v1alpha1",
                                                          "kind": "GpuConfig", "computeMode": "Default"}}}  # fmt: skip
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [request], "config": [{"requests": ["gpu"], **config}]}},
    }


def compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def allocated_to(claim: dict[str, Any], pool: str, device: str) -> dict[str, Any]:
    """The status the scheduler would write for ``claim`` given ``device`` of ``pool``: its allocation (with the
    claim's config copied as the scheduler copies it) and a pod it is reserved for."""
    return {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}],
                "config": [{"source": "FromClaim", **claim["spec"]["devices"]["config"][0]}],
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "0b7e3a53-6b0e-4c1e-9d47-1f9f6f5d2c11"}],
    }


def driver_status_patches(plane: ControlPlane, since: int) -> int:
    """How many resourceclaims/status patches of the driver the server answered 200 after ``since`` audit events."""
    count = 0
    for line in audit(plane)[since:]:
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (ref.get("resource"), ref.get("subresource"), event.get("verb")) == ("resourceclaims", "status", "patch"):
            count += event.get("userAgent", "").startswith("dradriver/") and event["responseStatus"]["code"] == 200
    return count


@pytest.mark.parametrize("plane", ["beta2", "beta1_only", "k132"])
def test_a_claim_is_prepared_and_its_device_status_written_through_the_servers_version(
    request: pytest.FixtureRequest, plane: str
) -> None:
    """No older scheduler runs here: the test allocates (status.allocation, as the scheduler writes it), then calls
    the plugin as a 1.32/1.33 kubelet does (DRA gRPC v1beta1). The driver reads the claim and writes status.devices
    (DRAResourceClaimDeviceStatus: beta and on in 1.33) in the version the server serves; 1.32 (the gate alpha and
    off) accepts the write and keeps nothing of it."""
    server: ControlPlane = request.getfixturevalue(plane)
    kube, version = server.kube, "v1beta2" if plane == "beta2" else "v1beta1"
    mark = len(audit(server))
    node = start_node(server, f"claims-{plane.replace('_', '-')}", "mixed", "static")
    claims = f"{GROUP}/{version}/namespaces/default/resourceclaims"
    try:
        release = "1.32" if plane == "k132" else "1.33"
        wait_published(server, node, version, intended(node, release))
        [device, *_] = [d["name"] for s in served(kube, version, node.name) for d in s["spec"].get("devices", [])
                        if (d.get("basic") or d)["attributes"]["type"]["string"] == "gpu"]  # fmt: skip
        claim = kube.request("POST", claims, compact(claim_body(version, "one-gpu")), fieldValidation="Strict")
        claim["status"] = allocated_to(claim, node.name, device)
        # Compact JSON, as kubectl sends it: the server keeps a config's raw bytes and compares them byte for byte
        # when status.devices is patched later, and a patch round-trip compacts them (the next test).
        claim = kube.request("PUT", f"{claims}/one-gpu/status", compact(claim))
        as_133 = KubeletClient(node.root / "registry", supported_versions=("v1beta1.DRAPlugin",),
                               health_versions=("v1alpha1.DRAResourceHealth",))  # fmt: skip
        ref = Claim("default", "one-gpu", claim["metadata"]["uid"])
        with as_133.register() as plugin:
            prepared = plugin.prepare([ref])[ref.uid]
        assert prepared.error == "", prepared.error
        assert [d["device_name"] for d in prepared.devices] == [device]
        if plane == "k132":
            kube.wait("the driver's status write", lambda: driver_status_patches(server, mark) >= 1, TIMEOUT)
            assert not kube.request("GET", f"{claims}/one-gpu")["status"].get("devices")
            with as_133.register() as plugin:
                assert plugin.unprepare([ref]) == {ref.uid: ""}
            assert '"level": "error"' not in node.driver.log, node.driver.log
            return
        status = kube.wait(
            "the driver to write status.devices",
            lambda: kube.request("GET", f"{claims}/one-gpu")["status"].get("devices"),
            TIMEOUT,
        )
        assert [(d["driver"], d["pool"], d["device"]) for d in status] == [(DRIVER, node.name, device)]
        with as_133.register() as plugin:
            assert plugin.unprepare([ref]) == {ref.uid: ""}
        kube.wait(
            "the driver to clear status.devices",
            lambda: not kube.request("GET", f"{claims}/one-gpu")["status"].get("devices"),
            TIMEOUT,
        )
        assert '"level": "error"' not in node.driver.log, node.driver.log
    finally:
        with contextlib.suppress(ApiError):
            kube.request("DELETE", f"{claims}/one-gpu")
        stop_node(server, node)


def test_on_1_33_a_config_sent_as_non_compact_json_keeps_status_devices_out_but_prepare_works(
    beta2: ControlPlane,
) -> None:
    """An API server limit (1.37 answers the same), documented in docs/deployment.md: the server keeps an allocated
    config's raw bytes and, when the driver patches status.devices, compares them with the patched object's
    (re-encoded, compact): "field is immutable". Prepare does not depend on it."""
    kube = beta2.kube
    node = start_node(beta2, "claims-spaced", "mixed", "static")
    claims = f"{GROUP}/v1beta2/namespaces/default/resourceclaims"
    try:
        wait_published(beta2, node, "v1beta2", intended(node))
        [device, *_] = [d["name"] for s in served(kube, "v1beta2", node.name) for d in s["spec"].get("devices", [])
                        if d["attributes"]["type"]["string"] == "gpu"]  # fmt: skip
        claim = kube.request("POST", claims, claim_body("v1beta2", "spaced"))  # json.dumps: ", " and ": "
        claim["status"] = allocated_to(claim, node.name, device)
        claim = kube.request("PUT", f"{claims}/spaced/status", claim)
        kubelet = KubeletClient(node.root / "registry", supported_versions=("v1beta1.DRAPlugin",),
                                health_versions=("v1alpha1.DRAResourceHealth",))  # fmt: skip
        ref = Claim("default", "spaced", claim["metadata"]["uid"])
        with kubelet.register() as plugin:
            assert plugin.prepare([ref])[ref.uid].error == ""
        refusal = "status.allocation: Invalid value"
        kube.wait("the server to refuse the status write", lambda: refusal in node.driver.log, TIMEOUT)
        assert "field is immutable" in node.driver.log
        assert not kube.request("GET", f"{claims}/spaced")["status"].get("devices")
        with kubelet.register() as plugin:
            assert plugin.unprepare([ref]) == {ref.uid: ""}
    finally:
        with contextlib.suppress(ApiError):
            kube.request("DELETE", f"{claims}/spaced")
        stop_node(beta2, node)


def test_a_server_serving_only_v1beta1_gets_the_slices_in_v1beta1(beta1_only: ControlPlane) -> None:
    assert [v["version"] for v in beta1_only.kube.request("GET", GROUP)["versions"]] == ["v1beta1"]
    nodes = [start_node(beta1_only, f"beta1-{mode}", "mixed", mode) for mode in ("static", "dynamic")]
    try:
        for node in nodes:
            wait_published(beta1_only, node, "v1beta1", intended(node))
            assert '"level": "error"' not in node.driver.log, node.driver.log
    finally:
        for node in nodes:
            stop_node(beta1_only, node)
    writes = driver_writes(beta1_only)
    assert ("create", "v1beta1") in writes
    assert not {w for w in writes if w[1] != "v1beta1"}, writes


def test_without_the_counters_gate_dynamic_mig_offers_only_what_cannot_overlap_and_says_why(
    no_counters: ControlPlane,
) -> None:
    # The server accepts sharedCounters and consumesCounters and silently drops them: a whole GPU and its MIG
    # placements would look independent. The driver withdraws every device that consumes counters, once, with
    # the fix; static MIG needs no counters and is published whole.
    dynamic = start_node(no_counters, "nocounters-dynamic", "mixed", "dynamic")
    static = start_node(no_counters, "nocounters-static", "mixed", "static")
    try:
        full = intended(dynamic)
        safe = [{"devices": [d for d in s.get("devices", []) if not d.get("consumesCounters")]} for s in full]
        safe = [{k: v for k, v in s.items() if v} for s in safe]
        assert 0 < sum(len(s.get("devices", [])) for s in safe) < sum(len(s.get("devices", [])) for s in full)
        wait_published(no_counters, dynamic, "v1beta2", safe)
        assert dynamic.driver.log.count("dropped the slices' shared counters") == 1
        assert "DRAPartitionableDevices" in dynamic.driver.log
        wait_published(no_counters, static, "v1beta2", intended(static))
        assert "shared counters" not in static.driver.log
    finally:
        stop_node(no_counters, dynamic)
        stop_node(no_counters, static)


def test_a_server_with_dra_off_is_refused_by_the_driver_with_the_fix(dra_off: ControlPlane) -> None:
    # 1.33's default answers the group's discovery with a plain 404: the driver still says what is missing and how
    # to turn it on, keeps retrying, and is not ready (its slices are not published).
    node = start_node(dra_off, "dra-off", "mixed", "static")
    try:
        reason = "does not serve resource.k8s.io at all, none of v1, v1beta2, v1beta1"
        dra_off.kube.wait("the driver to log why it cannot publish", lambda: reason in node.driver.log, TIMEOUT)
        assert "--runtime-config=resource.k8s.io/v1beta1=true" in node.driver.log
        assert "404 page not found" not in node.driver.log
        [port] = {int(m) for m in re.findall(r"serving metrics and readiness port=(\d+)", node.driver.log)}
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert answer.value.code == 503
        assert reason in answer.value.read().decode()
    finally:
        node.stop()
        dra_off.kube.delete("nodes", node.name)


# --- Kubernetes 1.32 ------------------------------------------------------------------------------------------------


def test_the_1_32_server_serves_only_v1beta1(k132: ControlPlane) -> None:
    version = k132.kube.request("GET", "/version")
    assert (version["major"], version["minor"]) == ("1", "32")
    assert [v["version"] for v in k132.kube.request("GET", GROUP)["versions"]] == ["v1beta1"]


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_simulated_node_is_published_through_v1beta1_on_1_32(k132: ControlPlane, profile: str) -> None:
    mark = len(audit(k132))
    nodes = start_nodes(k132, profile, ["none", "static"])
    try:
        for node in nodes:
            wait_published(k132, node, "v1beta1", intended(node, "1.32"))
            assert "detected Kubernetes version=1.32" in node.driver.log
            assert '"level": "error"' not in node.driver.log, node.driver.log
    finally:
        for node in nodes:
            stop_node(k132, node)
    writes = driver_writes(k132, mark)
    assert ("create", "v1beta1") in writes
    assert not {w for w in writes if w[1] != "v1beta1"}, writes


@pytest.mark.parametrize("plane", ["beta2", "k132"])
def test_where_the_server_has_no_device_taints_an_unhealthy_gpu_is_withdrawn_and_comes_back_when_healed(
    request: pytest.FixtureRequest, plane: str
) -> None:
    # 1.32's API has no device taints; 1.33 has them behind the alpha gate DRADeviceTaints (off here). The server
    # drops them, the publisher notices the stored slice lacks them and withdraws the GPU instead, so the scheduler
    # cannot give it out (--health-taint-fallback withdraw, the default).
    server: ControlPlane = request.getfixturevalue(plane)
    name = f"{plane.replace('_', '-')}-sick"
    node = start_node(server, name, "h100-nvl-pairs", "none")
    sick = "gpu-0000-17-00-0"
    sim = ["sim", "--sim-profile", node.profile, "--node-name", name, "--sim-state", str(node.root / "sim.json")]

    def offered() -> set[str]:
        return {d["name"] for s in served(server.kube, "v1beta1", name) for d in s["spec"].get("devices") or []}

    try:
        server.kube.wait(f"{sick} offered on {name}", lambda: sick in offered(), TIMEOUT)
        healthy = offered()
        # XID 62 (a micro-controller halt): fatal; the GPU keeps answering, and a reset heals it.
        assert main([*sim, "xid", "0000:17:00.0", "62"]) == 0
        server.kube.wait(f"{sick} withdrawn from {name}'s slices", lambda: offered() == healthy - {sick}, TIMEOUT)
        assert "withdrawing tainted devices from the slices instead" in node.driver.log
        assert main([*sim, "reset", "0000:17:00.0"]) == 0
        server.kube.wait(f"{sick} offered again on {name}", lambda: offered() == healthy, TIMEOUT)
    finally:
        stop_node(server, node)


def test_dynamic_mig_is_refused_at_start_on_1_32_with_the_fix(k132: ControlPlane) -> None:
    # 1.32 has no shared counters at all: the driver exits before publishing anything.
    with pytest.raises(RuntimeError) as failed:
        DriverRun(k132.root / "k132-dynamic", "k132-dynamic", k132.kubeconfig, profile="mixed", mig_mode="dynamic",
                  version="")  # fmt: skip
    assert "--mig-mode dynamic needs shared counters" in str(failed.value)
    assert "use --mig-mode static" in str(failed.value)


# --- the chart -----------------------------------------------------------------------------------------------------


def chart_device_classes(*args: str) -> list[dict[str, Any]]:
    done = run_helm("template", RELEASE, str(CHART), "--namespace", "dradriver", *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DeviceClass"]


STORED = [("beta2", "1.33.5", "v1beta2"), ("beta2", "1.32.9", "v1beta1"), ("k132", "1.32.9", "v1beta1")]


@pytest.mark.parametrize(("plane", "kube_version", "version"), STORED, ids=[f"{p}-{k}" for p, k, _ in STORED])
def test_the_charts_device_classes_for_older_releases_are_stored_as_rendered(
    request: pytest.FixtureRequest, plane: str, kube_version: str, version: str
) -> None:
    server: ControlPlane = request.getfixturevalue(plane)
    kube = server.kube
    served_versions = [v["version"] for v in kube.request("GET", GROUP)["versions"]]
    classes = chart_device_classes("--kube-version", kube_version, "--set", "gpu.migMode=static")
    assert classes and {c["apiVersion"] for c in classes} == {f"resource.k8s.io/{version}"}
    try:
        for obj in classes:
            # Strict: a field this release does not know is an error, not silently dropped.
            stored = kube.request("POST", f"{GROUP}/{version}/deviceclasses", obj, fieldValidation="Strict")
            assert stored["spec"] == obj["spec"]
            for other in served_versions:
                back = kube.request("GET", f"{GROUP}/{other}/deviceclasses/{obj['metadata']['name']}")
                assert back["spec"]["selectors"] == obj["spec"]["selectors"]
    finally:
        for obj in classes:
            kube.request("DELETE", f"{GROUP}/v1beta1/deviceclasses/{obj['metadata']['name']}")


def helm_against(plane: ControlPlane, *args: str) -> Any:
    """`helm install --dry-run=server`: helm asks the API server which versions it serves (discovery)."""
    return run_helm("install", RELEASE, str(CHART), "--namespace", "dradriver", "--dry-run=server",
                    "--kubeconfig", str(plane.kubeconfig), *args)  # fmt: skip


@pytest.mark.parametrize(("plane", "version"), [("beta2", "v1beta2"), ("beta1_only", "v1beta1"), ("k132", "v1beta1")])
def test_a_real_install_renders_device_classes_in_the_version_the_server_serves(
    request: pytest.FixtureRequest, plane: str, version: str
) -> None:
    done = helm_against(request.getfixturevalue(plane))
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout.split("MANIFEST:", 1)[-1].split("NOTES:", 1)[0]) if d]
    classes = [d for d in rendered if d.get("kind") == "DeviceClass"]
    assert classes and {c["apiVersion"] for c in classes} == {f"resource.k8s.io/{version}"}


def test_a_real_install_of_dynamic_mig_on_1_32_fails_with_the_fix(k132: ControlPlane) -> None:
    done = helm_against(k132, "--set", "gpu.migMode=dynamic")
    assert done.returncode != 0
    assert "gpu.migMode=dynamic needs shared counters" in done.stderr and "Kubernetes v1.32.9" in done.stderr
    assert "set gpu.migMode=static" in done.stderr, done.stderr


def test_a_real_install_on_a_server_with_dra_off_fails_with_the_fix(dra_off: ControlPlane) -> None:
    done = helm_against(dra_off)
    assert done.returncode != 0
    assert "serves no resource.k8s.io version" in done.stderr, done.stderr
    assert "--feature-gates=DynamicResourceAllocation=true" in done.stderr, done.stderr


@pytest.mark.parametrize(("plane", "kube_version"), [("beta2", "1.33.5"), ("k132", "1.32.9")])
def test_the_whole_chart_applies_and_its_config_policy_judges_claims_on_the_older_release(
    request: pytest.FixtureRequest, plane: str, kube_version: str, tmp_path: Path
) -> None:
    """Every object of the chart rendered for the release is accepted by that release's API server, and its
    opaque-config policy (CEL compiled by that release) refuses a bad config and admits a good one. (The policies'
    type-check status is written by kube-controller-manager, which does not run here.)"""
    server: ControlPlane = request.getfixturevalue(plane)
    kube, version = server.kube, "v1beta2" if plane == "beta2" else "v1beta1"
    done = run_helm("template", RELEASE, str(CHART), "--namespace", "default", "--kube-version", kube_version,
                    "--set", "gpu.migMode=static")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = tmp_path / "chart.yaml"
    rendered.write_text(done.stdout)
    command = [kubectl(), "--kubeconfig", str(server.kubeconfig)]
    claims = f"{GROUP}/{version}/namespaces/default/resourceclaims"
    applied = subprocess.run([*command, "apply", "--server-side", "-f", str(rendered)], capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
    try:
        assert applied.returncode == 0, applied.stdout + applied.stderr
        kinds = {d["kind"] for d in yaml.safe_load_all(done.stdout) if d}
        assert {"DaemonSet", "DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds

        bad = claim_body(version, "bad-config")
        bad["spec"]["devices"]["config"][0]["opaque"]["parameters"]["computeMode"] = "Turbo"

        def refused() -> str | None:
            try:
                kube.request("POST", claims, compact(bad))
            except ApiError as err:
                return str(err) if err.status in (403, 422) else None
            kube.request("DELETE", f"{claims}/bad-config")  # created before the policy was loaded: try again
            return None

        assert "computeMode allows Default, ExclusiveProcess or Prohibited" in kube.wait(
            "the opaque-config policy to refuse a bad config", refused, TIMEOUT
        )
        kube.request("POST", claims, compact(claim_body(version, "good-config")))
        kube.request("DELETE", f"{claims}/good-config")
    finally:
        subprocess.run([*command, "delete", "--ignore-not-found", "--wait=false", "-f", str(rendered)],
                       capture_output=True, timeout=120, check=False)  # fmt: skip
