"""A two-node ComputeDomain on two real kubelets and containerds of this machine, in both allocation modes: the
kubelets run an IMEX daemon pod (our image) on each node, the two daemons form one IMEX domain, and a worker pod
on each node gets its channel.

Both nodes are this module's own (``running_node``: Nodes cd-tray-a and cd-tray-b, each a kubelet, a containerd
and a `dradriver run` of its own), simulated GB200 trays (``gb200-nvl72-tray``: one clique) under the GPU driver
name ``gpu-tray.dradriver.dev`` with ``--compute-domains true``; the controller runs as a process. Daemon pods run
in the node's network (the node has no pod network to the API server), so each node has an address of its own on
``lo`` as its ``--node-ip`` (the kubelet refuses a loopback node IP): that is its InternalIP and its daemon's pod
IP, and each IMEX daemon binds and dials its own. The API server reaches a kubelet by its Hostname address, which
only ``localhost`` resolves to (docs/node-tests.md): containers' output comes from the kubelets' pod log files and
``nvidia-imex-ctl`` runs in the daemon's container through containerd (``ctr tasks exec``), not through kubectl.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from support.cd_cluster import NAMESPACE, ControllerRun, install_chart_parts
from support.cluster_fixtures import running_node
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane
from support.image import archive as image_archive
from support.kube_rest import ApiError, Kube
from support.node_pods import claim_names, pin_to, running
from support.real_node import RealNode, wait_for

from dradriver.computedomain import api
from dradriver.sim.fabric import IMEX_CHANNELS_MAJOR
from node.test_computedomains import GPU_DRIVER, IMAGE, PROFILE, TRAY_FLAGS

NODES = ("cd-tray-a", "cd-tray-b")
MODES = ("Single", "All")
USER_NS = "default"
TIMEOUT = 180.0
CHANNELS = "/dev/nvidia-caps-imex-channels"
WORKER_SCRIPT = f"ls -l {CHANNELS}/channel0; echo channels=$(ls {CHANNELS} | wc -l); env | grep COMPUTE_DOMAIN; " \
                "exec sleep 3600"  # fmt: skip


def node_addresses() -> list[str]:
    """One address per node, from the benchmarking range 198.18.0.0/15 (RFC 2544: no network uses it), random per
    run so that two runs on one machine do not share one."""
    base = f"198.18.{secrets.randbelow(256)}"
    first = 1 + secrets.randbelow(250)
    return [f"{base}.{first + i}" for i in range(len(NODES))]


def domain_name(mode: str) -> str:
    return f"two-node-{mode.lower()}"


def domain_doc(name: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": USER_NS},
        "spec": {
            "numNodes": 2,
            "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}, "allocationMode": mode},
        },
    }


def worker_doc(domain: str, node: str) -> dict[str, Any]:
    """A busybox pod on ``node`` with a channel claim from the domain's template."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{domain}-{node}", "namespace": USER_NS},
        "spec": {
            "resourceClaims": [{"name": "imex-channel", "resourceClaimTemplateName": f"{domain}-channel"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "docker.io/library/busybox:1.36",
                    "command": ["sh", "-c", WORKER_SCRIPT],
                    "resources": {"claims": [{"name": "imex-channel"}]},
                }
            ],
        },
    }
    return pin_to(pod, node)


@dataclass
class Trays:
    """The two nodes as GB200 trays with ComputeDomains on, and the controller."""

    nodes: list[RealNode]
    controller: ControllerRun

    @property
    def kube(self) -> Kube:
        return self.nodes[0].kube

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl(), "--kubeconfig", str(self.nodes[0].control_plane.kubeconfig), *args],
                              capture_output=True, text=True, timeout=150, input=input, check=False)  # fmt: skip

    def node(self, name: str) -> RealNode:
        return next(n for n in self.nodes if n.name == name)

    def daemon_pods(self, uid: str) -> list[dict[str, Any]]:
        return self.kube.list("pods", NAMESPACE, labelSelector=f"{api.DOMAIN_LABEL}={uid}")

    def labels(self) -> dict[str, str | None]:
        """Each node's domain label (None: none)."""
        return {
            n.name: (self.kube.get("nodes", n.name)["metadata"].get("labels") or {}).get(api.DOMAIN_LABEL)
            for n in self.nodes
        }

    def output(self, pod: dict[str, Any]) -> str:
        """The pod's first container's output so far, from its node's pod log files."""
        node = self.node(pod["spec"]["nodeName"])
        return "\n".join(next(iter(node.container_output(pod).values()), []))

    def imex_table(self, daemon: dict[str, Any]) -> str:
        """``nvidia-imex-ctl -N`` in the daemon pod's container (the simulated driver's, mounted by its claim)."""
        node = self.node(daemon["spec"]["nodeName"])
        [status] = daemon["status"]["containerStatuses"]
        container = status["containerID"].removeprefix("containerd://")
        done = node.containerd.ctr("tasks", "exec", "--exec-id", f"imex-ctl-{secrets.token_hex(4)}", container,
                                   "nvidia-imex-ctl", "-c", "/imexd/imexd.cfg", "-N", timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def describe(self) -> str:
        parts = []
        for pod in self.kube.list("pods", NAMESPACE, labelSelector=api.DOMAIN_LABEL):
            node = self.node(pod["spec"]["nodeName"]) if pod["spec"].get("nodeName") in NODES else None
            logs = "\n".join(next(iter(node.container_output(pod).values()), [])[-30:]) if node else ""
            parts.append(f"daemon pod {pod['metadata']['name']}: {json.dumps(pod.get('status'))}\nits log:\n{logs}")
        for pod in self.kube.list("pods", USER_NS):
            selector = f"involvedObject.uid={pod['metadata']['uid']}"
            events = [f"{e.get('reason')}: {e.get('message')}" for e in
                      self.kube.list("events", USER_NS, fieldSelector=selector)]  # fmt: skip
            parts.append(f"pod {pod['metadata']['name']}: {json.dumps(pod.get('status'))}\nevents: {events}")
        controller = "\n".join(self.controller.log.read_text(errors="replace").splitlines()[-30:])
        parts.append(f"--- controller (last 30 lines) ---\n{controller}")
        parts += [n.tails(20) for n in self.nodes]
        return "\n".join(parts)

    def wait(self, what: str, condition: Any, timeout: float = TIMEOUT) -> Any:
        try:
            return wait_for(what, condition, timeout, interval=0.5)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None


@pytest.fixture(scope="module")
def trays(control_plane: ControlPlane, device_classes: None) -> Iterator[Trays]:
    kube = control_plane.kube
    # Another module's (the chart parts are the same for all): then that one removes them, not this one.
    owned = kube.find("deviceclasses", api.DAEMON_CLASS) is None
    rendered = install_chart_parts(control_plane)
    archive = image_archive()
    with contextlib.ExitStack() as stack:

        def remove_slices() -> None:  # after the drivers stopped: a running one would publish them again
            for name in NODES:
                kube.delete_all("resourceslices", fieldSelector=f"spec.nodeName={name}")

        if owned:
            stack.callback(lambda: subprocess.run([kubectl(), "--kubeconfig", str(control_plane.kubeconfig),
                                                   "delete", "--ignore-not-found", "-f", str(rendered)],
                                                  capture_output=True, timeout=120, check=False))  # fmt: skip
        stack.callback(remove_slices)
        nodes = []
        for name, address in zip(NODES, node_addresses(), strict=True):
            settings = {"profile": PROFILE, "mig_mode": "none", "driver_name": GPU_DRIVER, "driver_args": TRAY_FLAGS}
            node = stack.enter_context(running_node(control_plane, name=name, node_ip=address, **settings))
            node.containerd.import_archive(archive, "localhost/dradriver")
            nodes.append(node)
        # Daemon pods reach the API server as a plugin pod on this node does (docs/deployment.md, "On a bare
        # kubelet"): in the node's network, at the API server's loopback address.
        daemon_env = [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(control_plane.port)},
        ]
        controller = ControllerRun(control_plane.kubeconfig, nodes[0].logs / "cd-controller.log", "two-node-controller",
                                   image=IMAGE, extra=("--daemon-host-network", "true", "--daemon-env",
                                                       json.dumps(daemon_env)))  # fmt: skip
        stack.callback(controller.stop)
        trays = Trays(nodes, controller)
        # Each node's driver process registered both drivers: the GPU driver and compute-domain.dradriver.dev.
        for node in nodes:
            trays.wait(f"{node.name}'s kubelet to register both drivers", lambda n=node: n.registrations() >= 2, 60)
        yield trays


@pytest.fixture
def leftovers(trays: Trays) -> Iterator[None]:
    """What a test left, deleted after it even when it failed: its workers and domain (the controller still runs
    and lets them go) and the nodes' labels, which would otherwise hold the nodes for the next mode's domain."""
    yield
    kube = trays.kube
    for doc in kube.list("pods", USER_NS):
        if doc["spec"].get("nodeName") in NODES:
            with contextlib.suppress(ApiError):
                kube.delete("pods", doc["metadata"]["name"], USER_NS)
    domains = [domain_name(mode) for mode in MODES]
    trays.kubectl("delete", "--ignore-not-found", "--timeout=60s", "-n", USER_NS, "computedomains", *domains)
    for name in NODES:
        if trays.labels().get(name) is not None:
            kube.patch("nodes", name, {"metadata": {"labels": {api.DOMAIN_LABEL: None}}})


def ready_daemons(trays: Trays, uid: str) -> dict[str, dict[str, Any]]:
    """The domain's daemon pods by node, once each node has a Ready one; each in its node's network, its pod IP
    the node's InternalIP (a different address on each node)."""

    def ready() -> dict[str, dict[str, Any]] | None:
        found = {p["spec"]["nodeName"]: p for p in trays.daemon_pods(uid) if running(p)}
        return found if sorted(found) == sorted(NODES) else None

    daemons: dict[str, dict[str, Any]] = trays.wait("a Ready daemon pod on each node", ready, 90)
    for node in trays.nodes:
        daemon = daemons[node.name]
        addresses = {a["type"]: a["address"] for a in trays.kube.get("nodes", node.name)["status"]["addresses"]}
        assert addresses["InternalIP"] == node.node_ip, addresses
        assert daemon["spec"]["hostNetwork"] is True and daemon["status"]["podIP"] == node.node_ip, daemon["status"]
        [status] = daemon["status"]["containerStatuses"]
        assert status["image"] == IMAGE, status
    return daemons


def check_status(trays: Trays, domain: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Both nodes in the domain's status, Ready, at their own addresses, with indices 0 and 1, in one clique."""
    entries = {e["name"]: e for e in domain["status"]["nodes"]}
    assert sorted(entries) == sorted(NODES), domain["status"]
    assert {e["ipAddress"] for e in entries.values()} == {n.node_ip for n in trays.nodes}, entries
    assert sorted(e["index"] for e in entries.values()) == [0, 1], entries
    assert {e["status"] for e in entries.values()} == {"Ready"}, entries
    [clique] = {e["cliqueID"] for e in entries.values()}
    assert clique, entries
    return entries


def imex_tables(trays: Trays, daemons: dict[str, dict[str, Any]], entries: dict[str, dict[str, Any]]) -> dict[str, str]:
    """``nvidia-imex-ctl -N`` of each daemon, once it lists itself and the other node connected."""
    rows = {f"{e['index']} compute-domain-daemon-{e['index']:04d} {e['ipAddress']}": e["name"] for e in
            entries.values()}  # fmt: skip
    tables = {}
    for node_name, daemon in daemons.items():
        want = {f"{row} {'I' if owner == node_name else 'C'}" for row, owner in rows.items()}

        def connected(daemon: dict[str, Any] = daemon, want: set[str] = want) -> str | None:
            table = trays.imex_table(daemon)
            return table if set(table.splitlines()) == want else None

        tables[node_name] = trays.wait(f"{node_name}'s IMEX daemon to list both nodes connected", connected, 30)
    return tables


def check_workers(trays: Trays, workers: list[dict[str, Any]], uid: str, mode: str) -> dict[str, str]:
    """Each worker's container has channel 0 (Single) or every channel (All), with /proc/devices' major, and its
    domain's UUID; its output returned by node."""
    count = 1 if mode == "Single" else api.MAX_IMEX_CHANNELS
    outputs = {}
    for worker in workers:

        def printed(worker: dict[str, Any] = worker) -> str | None:
            out = trays.output(worker)
            return out if "COMPUTE_DOMAIN_UUID" in out else None

        log = trays.wait(f"{worker['metadata']['name']}'s output", printed, 30)
        assert re.search(rf"^c\S+\s.*\b{IMEX_CHANNELS_MAJOR},\s+0\s.*\bchannel0$", log, re.MULTILINE), log
        assert f"channels={count}" in log.splitlines(), log
        assert f"COMPUTE_DOMAIN_UUID={uid}" in log, log
        outputs[worker["spec"]["nodeName"]] = log
    return outputs


def check_nothing_left(trays: Trays, uid: str, claims: list[tuple[str, str]]) -> None:
    """Nothing of the deleted domain is left in the API or on either node."""
    kube = trays.kube
    labelled = f"{api.DOMAIN_LABEL}={uid}"
    trays.wait("the domain's claim templates to be gone",
               lambda: not kube.list("resourceclaimtemplates", labelSelector=labelled), 30)  # fmt: skip
    assert not kube.list("daemonsets", NAMESPACE, labelSelector=labelled)
    assert not [c for c in kube.list("computedomaincliques", NAMESPACE) if c["metadata"]["name"].startswith(uid)]
    trays.wait("the claims of the workers and the daemons to be gone",
               lambda: not [c for c in claims if kube.find("resourceclaims", c[1], c[0])], 60)  # fmt: skip
    assert trays.labels() == dict.fromkeys(NODES)
    for node in trays.nodes:
        assert not list(node.cdi_dir.glob(f"{api.CDI_VENDOR}-*.json")), f"a CDI spec of the domain on {node.name}"
        plugin_dir = node.kubelet.plugins_dir / api.DRIVER_NAME
        checkpoint = json.loads((plugin_dir / "checkpoint.json").read_text())
        assert checkpoint["claims"] == {}, (node.name, checkpoint)
        assert not (plugin_dir / "domains" / uid).exists(), node.name


@pytest.mark.usefixtures("leftovers")
@pytest.mark.parametrize("mode", MODES)
def test_a_two_node_domain_has_a_daemon_pod_on_each_node_in_one_imex_domain_and_both_workers_get_channels(
    trays: Trays, mode: str
) -> None:
    kube = trays.kube
    name = domain_name(mode)
    applied = trays.kubectl("apply", "-f", "-", input=yaml.safe_dump(domain_doc(name, mode)))
    assert applied.returncode == 0, applied.stderr
    uid = kube.get("computedomains", name, USER_NS)["metadata"]["uid"]
    trays.wait("the domain's claim template", lambda: kube.find("resourceclaimtemplates", f"{name}-channel", USER_NS))

    # One worker per node: each one's prepare fails until its node's daemon is Ready; the kubelet retries.
    docs = [worker_doc(name, node) for node in NODES]
    applied = trays.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    assert applied.returncode == 0, applied.stderr

    def workers_running() -> list[dict[str, Any]] | None:
        pods = [p for d in docs if (p := kube.find("pods", d["metadata"]["name"], USER_NS)) is not None]
        return pods if len(pods) == len(docs) and all(running(p) for p in pods) else None

    workers: list[dict[str, Any]] = trays.wait("both workers to run", workers_running)
    daemons = ready_daemons(trays, uid)
    assert trays.labels() == dict.fromkeys(NODES, uid)
    waited = trays.kubectl("wait", "--for=condition=Ready", f"computedomain/{name}", "--timeout=60s")
    assert waited.returncode == 0, waited.stdout + waited.stderr + trays.describe()
    domain = kube.get("computedomains", name, USER_NS)
    entries = check_status(trays, domain)
    # One IMEX domain: each daemon's IMEX (the simulated driver's, mounted by its claim) has connected to the other.
    tables = imex_tables(trays, daemons, entries)
    outputs = check_workers(trays, workers, uid, mode)
    # What docs/computedomains.md shows (pytest -s prints it).
    print(f"\n$ kubectl wait --for=condition=Ready computedomain/{name}\n{waited.stdout}$ kubectl get "
          f"computedomain {name} -o jsonpath='{{.status.nodes}}'\n{json.dumps(domain['status']['nodes'])}")  # fmt: skip
    for node_name in NODES:
        print(f"--- {node_name}: daemon pod IP {daemons[node_name]['status']['podIP']}; nvidia-imex-ctl -N in it:\n"
              f"{tables[node_name]}--- {node_name}: the worker's output:\n{outputs[node_name]}")  # fmt: skip
    claims = [(USER_NS, c) for w in workers for c in claim_names(w)]
    claims += [(NAMESPACE, c) for d in daemons.values() for c in claim_names(d)]

    # The workers go: their channels are unprepared, the node labels removed, the daemon pods go with them.
    deleted = trays.kubectl("delete", "--wait=true", "--timeout=120s", "-f", "-", input=yaml.safe_dump_all(docs))
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    trays.wait("both node labels to be removed", lambda: trays.labels() == dict.fromkeys(NODES), 60)
    trays.wait("both daemon pods to be gone", lambda: not trays.daemon_pods(uid), 90)
    # Then the domain: nothing of it is left on either node.
    deleted = trays.kubectl("delete", "computedomain", name, "--timeout=60s")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr + trays.describe()
    assert kube.find("computedomains", name, USER_NS) is None
    check_nothing_left(trays, uid, claims)
