"""Pods with our claims through the real kubelet and containerd: what the container sees is what the claim's CDI
spec names; deletion makes the kubelet unprepare (spec gone, MIG partition destroyed, status.devices cleared);
shared claims, several claims and init containers, a claim that cannot be prepared."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

from support.kube_rest import ApiError, Kube
from support.node_pods import Workloads, cdi_specs_of, claims_of, status_devices, unprepared
from support.real_node import RealNode, wait_for

NAMESPACE = "default"
GPU_CLASS = "gpu.dradriver.dev"
MIG_CLASS = "mig.dradriver.dev"
# Prints what the container received, then stays up.
REPORT = "env | grep ^DRADRIVER_DEVICE_ | sort; find /dev | sed 's/^/node /'; sed 's/^/mount /' /proc/self/mountinfo"


def template(name: str, device_class: str, selector: str | None = None, config: Any = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [{"name": "dev", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"requests": ["dev"], "opaque": {"driver": GPU_CLASS, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def claim(name: str, device_class: str) -> dict[str, Any]:
    body = template(name, device_class)
    return {**body, "kind": "ResourceClaim", "spec": body["spec"]["spec"]}


def pod(
    name: str, claims: dict[str, dict[str, str]], command: str = REPORT, init: list[str] | None = None
) -> dict[str, Any]:
    """A pod using ``claims`` (pod claim name -> {"resourceClaimTemplateName"|"resourceClaimName": …}); its main
    container uses all of them, each init container in ``init`` the one it names."""
    uses = [{"name": claim} for claim in claims]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": claim, **source} for claim, source in claims.items()],
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "command": ["sh", "-c", f"{command}; sleep 3600"],
                "resources": {"claims": uses},
            }
        ],
    }
    if init:
        spec["initContainers"] = [
            {
                "name": f"init-{claim}",
                "image": "busybox:1.36",
                "command": ["sh", "-c", "env | grep ^DRADRIVER_DEVICE_ | sort"],
                "resources": {"claims": [{"name": claim}]},
            }
            for claim in init
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def spec_of(node: RealNode, claim_uid: str) -> dict[str, Any]:
    [path] = cdi_specs_of(node, claim_uid)
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def edits_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]


def sim_show(node: RealNode) -> str:
    """`dradriver sim show` of the node's simulated GPUs, naming the claim owning each MIG partition."""
    return node.sim("show", "--state-dir", str(node.plugin_dir))


def wait_unprepared(node: RealNode, kube: Kube, claim: dict[str, Any]) -> None:
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    wait_for(f"the kubelet to unprepare claim {name}", lambda: unprepared(node, uid), 90)
    wait_for(f"status.devices of claim {name} to be cleared", lambda: status_devices(kube, claim) == [], 30)


def test_a_mig_pod_sees_what_its_cdi_spec_names_and_deleting_it_destroys_the_partition(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    name = unique("mig")
    selector = 'device.attributes["gpu.dradriver.dev"].profile == "1g.5gb"'
    docs = [template(name, MIG_CLASS, selector), pod(name, {"mig": {"resourceClaimTemplateName": name}})]
    workloads.apply(docs)
    try:
        [running] = workloads.wait_running(docs[1])
        [owned] = claims_of(kube, running)
        uid = owned["metadata"]["uid"]
        spec = spec_of(node, uid)
        logs = workloads.logs(running)
        lines = [line.split(" ", 1)[1] for line in logs.splitlines()]
        env = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in lines if line.startswith("DRADRIVER_")}
        wanted_env = {
            e.split("=", 1)[0]: e.split("=", 1)[1]
            for edits in edits_of(spec)
            for e in edits.get("env", [])
            if e.startswith("DRADRIVER_DEVICE_")
        }
        assert wanted_env and env == wanted_env, (env, wanted_env)
        assert all(value.startswith("MIG-") for value in env.values()), env
        nodes = {line.removeprefix("node ") for line in lines if line.startswith("node ")}
        wanted_nodes = {n["path"] for edits in edits_of(spec) for n in edits.get("deviceNodes", [])}
        assert wanted_nodes and wanted_nodes <= nodes, (wanted_nodes - nodes, spec)
        mounted = {line.split()[5] for line in lines if line.startswith("mount ")}
        wanted_mounts = {m["containerPath"] for edits in edits_of(spec) for m in edits.get("mounts", [])}
        assert wanted_mounts and wanted_mounts <= mounted, (wanted_mounts - mounted, spec)
        assert uid in sim_show(node), "no MIG partition owned by the claim"
        assert status_devices(kube, owned), "the driver wrote no status.devices"
    finally:
        workloads.delete(reversed(docs))
    wait_for("the claim to be unprepared", lambda: unprepared(node, uid), 90)
    assert uid not in sim_show(node), "the claim's MIG partition outlived its pod"


def test_a_claim_shared_by_two_pods_stays_prepared_until_the_last_pod_goes(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    name = unique("shared")
    first, second = (
        pod(f"{name}-a", {"gpu": {"resourceClaimName": name}}),
        pod(f"{name}-b", {"gpu": {"resourceClaimName": name}}),
    )
    docs = [claim(name, GPU_CLASS), first, second]
    workloads.apply(docs)
    try:
        [a] = workloads.wait_running(first)
        [b] = workloads.wait_running(second)
        [shared] = claims_of(kube, a)
        uid = shared["metadata"]["uid"]
        assert len(cdi_specs_of(node, uid)) == 1
        device = [line for line in workloads.logs(a).splitlines() if "DRADRIVER_DEVICE_" in line]
        assert device and [line.split(" ", 1)[1] for line in device] == [
            line.split(" ", 1)[1] for line in workloads.logs(b).splitlines() if "DRADRIVER_DEVICE_" in line
        ]
        workloads.delete([first])
        # The kubelet unprepares a claim only when its last pod on the node is gone.
        assert workloads.wait_running(second) and cdi_specs_of(node, uid)
        workloads.delete([second])
        wait_unprepared(node, kube, shared)
    finally:
        workloads.delete(reversed(docs))


def test_two_claims_in_one_pod_with_init_containers_each_get_their_own_devices(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    name = unique("two")
    docs = [
        template(f"{name}-gpu", GPU_CLASS),
        claim(f"{name}-mig", MIG_CLASS),
        pod(name, {"gpu": {"resourceClaimTemplateName": f"{name}-gpu"}, "mig": {"resourceClaimName": f"{name}-mig"}},
            init=["gpu", "mig"]),
    ]  # fmt: skip
    workloads.apply(docs)
    try:
        [running] = workloads.wait_running(docs[2])
        claims = claims_of(kube, running)
        assert len(claims) == 2
        logs = workloads.logs(running)
        by_container: dict[str, list[str]] = {}
        for line in logs.splitlines():
            prefix, _, text = line.partition(" ")
            if text.startswith("DRADRIVER_DEVICE_"):
                by_container.setdefault(prefix.split("/")[-1].rstrip("]"), []).append(text.split("=", 1)[1])
        assert [v[:4] for v in by_container["init-gpu"]] == ["GPU-"], by_container
        assert [v[:4] for v in by_container["init-mig"]] == ["MIG-"], by_container
        assert sorted(by_container["main"]) == sorted(by_container["init-gpu"] + by_container["init-mig"])
        uids = [c["metadata"]["uid"] for c in claims]
        assert all(cdi_specs_of(node, uid) for uid in uids)
    finally:
        workloads.delete(reversed(docs))
    for owned in claims:
        wait_unprepared(node, kube, owned)


BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
POLICY_BINDING = "dradriver-opaque-config"


@contextlib.contextmanager
def config_policy_unbound(kube: Kube) -> Iterator[None]:
    """The opaque-config admission policy's binding (which the cluster tests' manifests test installs) removed for
    the duration, so a malformed config reaches prepare; put back afterwards."""
    try:
        binding = kube.request("GET", f"{BINDINGS}/{POLICY_BINDING}")
    except ApiError as err:
        if err.status != 404:
            raise
        binding = None
    if binding is not None:
        kube.request("DELETE", f"{BINDINGS}/{POLICY_BINDING}")
    try:
        yield
    finally:
        if binding is not None:
            meta = binding["metadata"]
            kube.request(
                "POST", BINDINGS, {**binding, "metadata": {"name": meta["name"], "labels": meta.get("labels")}}
            )


def test_a_claim_that_cannot_be_prepared_shows_the_drivers_error_in_the_pods_events(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    name = unique("badcfg")
    # Valid for the API server (opaque parameters are the driver's business), refused by our prepare.
    config = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Bogus"}}
    docs = [template(name, GPU_CLASS, config=config), pod(name, {"gpu": {"resourceClaimTemplateName": name}})]
    with config_policy_unbound(kube):
        # The API server drops the binding from its cache shortly after the delete.
        wait_for("the claim template to be admitted", lambda: _applied(workloads, docs), 30, interval=1)
    try:
        created = wait_for("the pod to be bound", lambda: (p := kube.find("pods", name, NAMESPACE)) and
                           p["spec"].get("nodeName") and p)  # fmt: skip
        try:
            events = wait_for(
                "the kubelet's event about the failed prepare",
                lambda: [e for e in workloads.events(created) if e.startswith("FailedPrepareDynamicResources")],
                90,
            )
        except TimeoutError as err:
            raise AssertionError(f"{err}: {workloads.events(created)}\n{node.tails(20)}") from None
        assert any("Bogus" in e and "strategy" in e for e in events), events
        assert kube.get("pods", name, NAMESPACE)["status"].get("phase") == "Pending"
    finally:
        workloads.delete(reversed(docs))


def _applied(workloads: Workloads, docs: list[dict[str, Any]]) -> bool:
    try:
        workloads.apply(docs)
    except AssertionError:
        return False
    return True
