"""The scale harness: the real control plane as the cluster tier runs it (support/control_plane.py) plus kwok
(``scripts/build-kwok``) keeping N fake Nodes Ready and marking the pods bound to them Running, with kwok's own
stages. Each Node gets the ResourceSlices `dradriver run` publishes for its simulated profile (support/sim_slices.py:
our slice building and publisher), one pool per node, renamed for the node and with its own GPU UUIDs.

Creation is parallel requests over one HTTP connection pool. Used by tests/cluster/test_cluster_scale.py (a small
fleet, in CI) and benchmarks/bench_cluster_scale.py (the full size, by hand); see docs/performance.md,
"Cluster scale"."""

from __future__ import annotations

import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3

from dradriver.cli.explain_cluster import KubernetesReader
from dradriver.cli.explain_input import Document
from dradriver.cli.explain_outcome import explain_document
from support import required
from support.cluster_pods import kubectl
from support.control_plane import Component, ControlPlane, binaries_dir, missing_binaries
from support.sim_slices import DRIVER, published_slices

REPO = Path(__file__).resolve().parents[2]
KWOK_BUILD = REPO / "scripts" / "build-kwok"
# kwok manages the Nodes with this annotation (--manage-nodes-with-annotation-selector), and only those.
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# The name the slice templates are built for, replaced by each node's: long and odd, so no other text matches it.
TEMPLATE_NODE = "scale-template-node-0"
GPU_UUID = re.compile(r"\b(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# The Node's capacity, as a kubelet reports it; kwok keeps what is set.
NODE_RESOURCES = {"cpu": "192", "memory": "2Ti", "pods": "110"}
PAGE = 500  # objects per LIST page, as kubectl asks for


def kwok_binary() -> Path:
    """The built kwok; missing, the test stops (a skip, or a failure under DRADRIVER_REQUIRE_CLUSTER)."""
    path = required.built_by(KWOK_BUILD, dir_env="DRADRIVER_KWOK_DIR", name="kwok")
    if not os.access(path, os.X_OK) or not (path.parent / "stages.yaml").is_file():
        required.need(
            "kwok",
            f"the scale harness runs thousands of fake Nodes with it; {path} (and stages.yaml beside it) not built",
            f"build it with `{KWOK_BUILD.relative_to(REPO)}` (Go and the module proxy; `scripts/test` does)",
            tier=required.CLUSTER,
        )
    return path


@dataclass(frozen=True)
class NodeGroup:
    """``count`` nodes of simulated ``profile`` (support/nodes.py) in ``mig_mode``, named ``<prefix>-<index>``."""

    count: int
    profile: str = "hgx-h100-80gb"  # a DGX H100's 8 GPUs
    mig_mode: str = "none"
    prefix: str = "h100"


class Pool:
    """Requests to the API server as the admin, over one connection pool shared by ``workers`` threads."""

    def __init__(self, plane: ControlPlane, workers: int = 16) -> None:
        self.server = plane.server
        self.workers = workers
        self._http = urllib3.PoolManager(
            num_pools=2,
            maxsize=workers,
            block=True,
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(plane.pki.ca_cert),
            cert_file=str(plane.pki.admin_cert),
            key_file=str(plane.pki.admin_key),
            timeout=urllib3.Timeout(connect=10.0, read=120.0),
            retries=False,
        )

    def request(self, method: str, path: str, body: bytes | None = None, **query: str) -> Any:
        """The answer's JSON; an error status raises RuntimeError naming the request."""
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        response = self._http.request(method, url, body=body, headers={"Content-Type": content_type})
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {response.data[:300]!r}")
        return json.loads(response.data) if response.data else None

    def each(self, work: Callable[[Any], None], items: Iterable[Any]) -> None:
        """``work`` on every item, ``workers`` at a time; the first error raised again."""
        with ThreadPoolExecutor(self.workers) as executor:
            for _ in executor.map(work, items):
                pass

    def pages(self, path: str, **query: str) -> Iterator[dict[str, Any]]:
        """Every item of a LIST, page by page (limit/continue)."""
        token = ""
        while True:
            paging = {"limit": str(PAGE), **({"continue": token} if token else {})}
            page = self.request("GET", path, None, **query, **paging)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def close(self) -> None:
        self._http.clear()


def slice_template(profile: str, mig_mode: str) -> str:
    """The slices `dradriver run` publishes for a node of ``profile`` named TEMPLATE_NODE, as JSON text without the
    server's metadata: what :func:`node_slices` fills in per node."""
    slices = published_slices(profile, mig_mode, node=TEMPLATE_NODE)
    for index, obj in enumerate(slices):
        obj["metadata"] = {"name": f"{TEMPLATE_NODE}-{DRIVER}-{index}"}
    return json.dumps(slices)


def node_slices(template: str, node: str, node_uid: str) -> list[dict[str, Any]]:
    """``template``'s slices for ``node``: its name in pool, nodeName and slice names; its own GPU and MIG UUIDs (the
    same per node on every run); owned by the Node, as the driver's are."""
    text = GPU_UUID.sub(lambda m: f"{m.group(1)}-{uuid.uuid5(uuid.NAMESPACE_URL, node + m.group(0))}", template)
    slices: list[dict[str, Any]] = json.loads(text.replace(TEMPLATE_NODE, node))
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    for obj in slices:
        obj["metadata"]["ownerReferences"] = [owner]
    return slices


def node_object(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node kwok manages (its annotation), labelled as a kubelet labels its node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", **(labels or {})},
        },
        "status": {"capacity": NODE_RESOURCES, "allocatable": NODE_RESOURCES},
    }


@dataclass
class Fleet:
    """What :func:`create_fleet` made: node names, devices published, and how long each step took."""

    nodes: list[str]
    devices: int
    slices: int
    create_seconds: float
    ready_seconds: float = 0.0


def start_kwok(plane: ControlPlane) -> Component:
    """kwok on the plane's admin kubeconfig, managing the Nodes with KWOK_ANNOTATION; ``plane`` stops it with the
    rest."""
    binary = kwok_binary()
    kwok = Component(
        "kwok",
        [
            str(binary),
            f"--kubeconfig={plane.kubeconfig}",
            f"--config={binary.parent / 'stages.yaml'}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--cidr=10.128.0.0/16",  # pod IPs
            "--node-lease-duration-seconds=0",  # no Leases: nothing here reads them (no node lifecycle controller)
        ],
        plane.logs / "kwok.log",
    )
    kwok.start()
    plane.components.append(kwok)
    return kwok


def create_fleet(plane: ControlPlane, pool: Pool, groups: list[NodeGroup]) -> Fleet:
    """Create every group's Nodes and their slices (parallel, over ``pool``), then wait until kwok reports each
    Node Ready."""
    templates = {(g.profile, g.mig_mode): slice_template(g.profile, g.mig_mode) for g in groups}
    work = [(f"{g.prefix}-{i:05d}", templates[g.profile, g.mig_mode]) for g in groups for i in range(g.count)]
    counted = [0, 0]  # slices, devices
    counting = threading.Lock()  # += from many threads loses counts without it

    def one(item: tuple[str, str]) -> None:
        name, template = item
        node = pool.request("POST", "/api/v1/nodes", json.dumps(node_object(name)).encode())
        # Admission (TaintNodesByCondition) taints a new Node not-ready; the node lifecycle controller would lift it
        # once the node reports Ready. It is not running (it would also want heartbeats), so the harness lifts it.
        pool.request("PATCH", f"/api/v1/nodes/{name}", b'{"spec":{"taints":null}}')
        for obj in node_slices(template, name, node["metadata"]["uid"]):
            pool.request("POST", "/apis/resource.k8s.io/v1/resourceslices", json.dumps(obj).encode())
            with counting:
                counted[0] += 1
                counted[1] += len(obj["spec"].get("devices") or ())

    started = time.monotonic()
    pool.each(one, work)
    created = time.monotonic() - started
    fleet = Fleet([name for name, _ in work], counted[1], counted[0], created)
    wait_ready(plane, pool, len(work))
    fleet.ready_seconds = time.monotonic() - started
    return fleet


def wait_ready(plane: ControlPlane, pool: Pool, count: int, timeout: float = 600.0) -> None:
    """Until ``count`` kwok Nodes are Ready (kwok's node-initialize stage), polling page by page."""

    def ready() -> bool:
        nodes = pool.pages("/api/v1/nodes", labelSelector="type=kwok")
        return sum(1 for n in nodes if _condition(n, "Ready")) >= count

    plane.kube.wait(f"{count} kwok nodes to be Ready", ready, timeout)


def _condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in (obj.get("status") or {}).get(
        "conditions") or [])  # fmt: skip


# --- the scheduler's own figures ------------------------------------------------------------------------------


def scheduler_port(plane: ControlPlane) -> int:
    """The kube-scheduler's secure port, from its command line."""
    scheduler = next(c for c in plane.components if c.name == "kube-scheduler")
    flag = next(a for a in scheduler.argv if a.startswith("--secure-port="))
    return int(flag.partition("=")[2])


def scheduler_metrics(plane: ControlPlane) -> str:
    """The scheduler's /metrics text, read with the admin's client certificate; the scheduler's serving certificate is
    the self-signed one it wrote into its --cert-dir, trusted as such."""
    context = ssl.create_default_context(cafile=plane.root / "scheduler-certs" / "kube-scheduler.crt")
    context.check_hostname = False  # issued to "localhost@<time>" and 127.0.0.1: the chain is what is checked
    context.load_cert_chain(plane.pki.admin_cert, plane.pki.admin_key)
    http = urllib3.PoolManager(ssl_context=context, retries=False, timeout=30.0)
    response = http.request("GET", f"https://127.0.0.1:{scheduler_port(plane)}/metrics")
    if response.status != 200:
        raise RuntimeError(f"kube-scheduler /metrics: HTTP {response.status}: {response.data[:200]!r}")
    return str(response.data.decode())


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{key}="{want}"' in head for key, want in labels.items()):
            total += float(value)
    return total


# The scheduler's histograms read for one pod: its attempts (the scheduling cycle: filter, score, reserve of every
# plugin, the DRA plugin's allocation among them) and the SLI (first attempt to bound, less waits for gates).
SCHEDULER_FIGURES = {
    "attempt": ("scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
    "sli": ("scheduler_pod_scheduling_sli_duration_seconds", {}),
}


def scheduler_snapshot(plane: ControlPlane, result: str = "scheduled") -> dict[str, tuple[float, float]]:
    """(sum, count) of each of SCHEDULER_FIGURES now, the attempts those with ``result`` ("scheduled",
    "unschedulable")."""
    text = scheduler_metrics(plane)
    snapshot = {}
    for key, (name, labels) in SCHEDULER_FIGURES.items():
        wanted = {**labels, "result": result} if "result" in labels else labels
        snapshot[key] = (metric_sum(text, f"{name}_sum", **wanted), metric_sum(text, f"{name}_count", **wanted))
    return snapshot


def scheduler_seconds(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Per figure, the seconds observed between the snapshots (one pod: its own time) and how many observations."""
    return {
        key: {"seconds": after[key][0] - before[key][0], "observations": int(after[key][1] - before[key][1])}
        for key in SCHEDULER_FIGURES
    }


# --- one pod: explain's answer and the scheduler's placement -----------------------------------------------------

NAMESPACE = "scale"
GATE = "dradriver.dev/scale-probe"


@dataclass(frozen=True)
class Probe:
    """A pod with one claim: ``count`` devices of DeviceClass ``device_class``."""

    name: str = "probe"
    device_class: str = "gpu.dradriver.dev"
    count: int = 1


def create_gated_probe(pool: Pool, probe: Probe) -> None:
    """The probe's namespace, its ResourceClaim, and its pod held by a scheduling gate: Pending until
    :func:`release_probe`, so explain and the scheduler see the same pod in the same cluster."""
    if not list(pool.pages("/api/v1/namespaces", fieldSelector=f"metadata.name={NAMESPACE}")):
        pool.request("POST", "/api/v1/namespaces", json.dumps({"metadata": {"name": NAMESPACE}}).encode())
    request = {"name": "gpu", "exactly": {"deviceClassName": probe.device_class, "count": probe.count}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": probe.name},
             "spec": {"devices": {"requests": [request]}}}  # fmt: skip
    pool.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", json.dumps(claim).encode())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe.name},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": probe.name}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    pool.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", json.dumps(pod).encode())


def release_probe(plane: ControlPlane, pool: Pool, probe: Probe, timeout: float = 300.0) -> dict[str, Any]:
    """Lift the probe's gate, wait for the scheduler to bind it and kwok to run it; the scheduler's own seconds for
    it (its metrics, read before and after), the node it chose, and the wall time seen from here."""
    before = scheduler_snapshot(plane)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{probe.name}"
    started = time.monotonic()
    pool.request("PATCH", path, b'{"spec":{"schedulingGates":null}}')
    pod = plane.kube.wait("the probe pod to be bound", lambda: _bound(pool.request("GET", path)), timeout)
    bound = time.monotonic() - started
    running = plane.kube.wait("the probe pod to run (kwok)", lambda: _running(pool.request("GET", path)), timeout)
    plane.kube.wait("the scheduler to count the attempt",
                    lambda: scheduler_snapshot(plane)["attempt"][1] > before["attempt"][1], timeout)  # fmt: skip
    figures = scheduler_seconds(before, scheduler_snapshot(plane))
    return {"node": pod["spec"]["nodeName"], "bound_wall_seconds": bound, "phase": running["status"]["phase"],
            **figures}  # fmt: skip


def release_unschedulable_probe(
    plane: ControlPlane, pool: Pool, probe: Probe, timeout: float = 120.0
) -> dict[str, Any]:
    """Lift the gate of a probe that fits on no node; wait for the scheduler to mark it unschedulable
    (PodScheduled False) and count that attempt in its metrics: the condition and the scheduler's seconds for the
    unschedulable attempts between lifting the gate and now."""
    before = scheduler_snapshot(plane, "unschedulable")
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{probe.name}"
    pool.request("PATCH", path, b'{"spec":{"schedulingGates":null}}')
    pod = plane.kube.wait("the scheduler to find the probe unschedulable",
                          lambda: _unschedulable(pool.request("GET", path)), timeout)  # fmt: skip
    plane.kube.wait("the scheduler to count the unschedulable attempt",
                    lambda: scheduler_snapshot(plane, "unschedulable")["attempt"][1] > before["attempt"][1],
                    timeout)  # fmt: skip
    figures = scheduler_seconds(before, scheduler_snapshot(plane, "unschedulable"))
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return {"node": pod["spec"].get("nodeName"), "condition": condition, **figures}


def delete_probe(pool: Pool, probe: Probe) -> None:
    """The probe's pod and claim gone (already gone is fine)."""
    for path in (f"/api/v1/namespaces/{NAMESPACE}/pods/{probe.name}",
                 f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{probe.name}"):  # fmt: skip
        try:
            pool.request("DELETE", path)
        except RuntimeError as error:
            if "HTTP 404" not in str(error):
                raise


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled = [c for c in conditions if c.get("type") == "PodScheduled"]
    return pod if scheduled and scheduled[0].get("reason") == "Unschedulable" else None


def _bound(pod: dict[str, Any]) -> dict[str, Any] | None:
    return pod if pod["spec"].get("nodeName") else None


def _running(pod: dict[str, Any]) -> dict[str, Any] | None:
    return pod if pod["status"].get("phase") == "Running" else None


def time_explain(plane: ControlPlane, probe: Probe, *, runs: int = 3) -> dict[str, Any]:
    """`dradriver explain --pod` on the probe as a user runs it (a new process each time, over the admin
    kubeconfig): the wall time of each run and its verdict."""
    argv = [sys.executable, "-m", "dradriver", "explain", "--pod", f"{NAMESPACE}/{probe.name}",
            "--kubeconfig", str(plane.kubeconfig), "-o", "json"]  # fmt: skip
    seconds, answer, code = [], {}, -1
    for _ in range(runs):
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        seconds.append(time.monotonic() - started)
        code = done.returncode
        if done.returncode not in (0, 1):
            raise RuntimeError(f"explain exited {done.returncode}:\n{done.stdout}{done.stderr}")
        answer = json.loads(done.stdout)
    (claim,) = answer["claims"]
    return {"seconds": seconds, "best_seconds": min(seconds), "median_seconds": statistics.median(seconds),
            "exit": code, "fits": claim["fits"],
            "node": claim.get("node"), "start_up_seconds": start_up_seconds(runs),
            "in_process": explain_parts(plane, probe)}  # fmt: skip


def explain_parts(plane: ControlPlane, probe: Probe) -> dict[str, Any]:
    """Where explain's time goes, in this process: reading every ResourceSlice (paginated, as `explain --pod` reads
    them), then the allocator over them for the probe's claim, twice (the first also builds the CEL parser, as every
    `explain` process does: the first is the one a user pays); and how much JSON the slices are (compact, as the API
    server sends them, with the apiVersion and kind the reader adds to each)."""
    reader = KubernetesReader(str(plane.kubeconfig), None)
    try:
        started = time.monotonic()
        slices = reader.list_resource_slices()
        read = time.monotonic() - started
        classes, claim = reader.list_device_classes(), reader.get_claim(NAMESPACE, probe.name)
    finally:
        reader.close()
    assert claim is not None
    allocator = []
    for _ in range(2):
        started = time.monotonic()
        explain_document(Document(claim, "probe"), slices=slices, classes=classes, allocated=[], node=None)
        allocator.append(time.monotonic() - started)
    size = len(json.dumps(slices, separators=(",", ":")).encode())
    return {"slices": len(slices), "slices_json_bytes": size, "read_slices_seconds": read,
            "allocator_first_seconds": allocator[0],
            "allocator_seconds": allocator[1]}  # fmt: skip


def start_up_seconds(runs: int = 3) -> float:
    """The best wall time of `dradriver explain --help`: the interpreter, the imports and the command line, which
    every explain pays before it reads the cluster (measured beside it, under the same load)."""
    seconds = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "dradriver", "explain", "--help"], capture_output=True, check=True,
                       timeout=120)  # fmt: skip
        seconds.append(time.monotonic() - started)
    return min(seconds)


# --- the whole harness ------------------------------------------------------------------------------------------


@dataclass
class ScaleCluster:
    """A running harness: the plane, kwok, the fleet, and the pool its requests go through."""

    plane: ControlPlane
    kwok: Component
    pool: Pool
    fleet: Fleet


@contextmanager
def scale_cluster(root: Path, groups: list[NodeGroup], *, workers: int = 16) -> Iterator[ScaleCluster]:
    """The control plane the cluster tier runs (its DeviceClasses applied), kwok, and ``groups``' nodes and slices,
    under ``root``; stopped again on exit (``root`` kept: the caller removes it, or keeps its logs)."""
    directory = binaries_dir()
    missing = missing_binaries(directory)
    if missing:
        required.need(
            "the real control plane",
            f"the scale harness runs it; {', '.join(missing)} not in {directory}",
            "build it with `scripts/build-control-plane` (`scripts/test` does)",
            tier=required.CLUSTER,
        )
    kwok_binary()
    plane = ControlPlane(directory, root)
    try:
        plane.start()
        apply_device_classes(plane)
        kwok = start_kwok(plane)
        pool = Pool(plane, workers)
        try:
            yield ScaleCluster(plane, kwok, pool, create_fleet(plane, pool, groups))
        finally:
            pool.close()
    finally:
        plane.stop()


def apply_device_classes(plane: ControlPlane) -> None:
    """Our DeviceClasses (manifests/deviceclasses), as the cluster tests' fixture applies them."""
    subprocess.run(
        [kubectl(), "--kubeconfig", str(plane.kubeconfig), "apply", "--server-side", "-f",
         str(REPO / "manifests" / "deviceclasses")],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
