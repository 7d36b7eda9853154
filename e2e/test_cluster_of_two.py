"""Three kind nodes (a control plane and two workers), made with README's "Try it on kind" commands, two more
nodes in the config, and the chart installed with ComputeDomains on and the simulated GB200 tray on every node
(two ``--set`` values, as docs/computedomains.md installs it). The plugin pods run on the workers only (the control
plane keeps its taint), reaching the API server through its service from another node; pods on a worker reach
CoreDNS on the control plane over the pod network scripts/build-kind's node image sets up (no kindnetd); README's
scenario runs on a worker; a ComputeDomain of two nodes spans both workers, with an IMEX daemon pod on each.

Why a second worker rather than the plugin on the control plane too: a user's kind cluster for a multi-node job
adds workers and leaves the control plane's taint alone, and the control plane, already the busiest node (API
server, etcd, controllers), would run a plugin, an IMEX daemon and a worker beside them. A worker node holds about
0.9 GB here with its plugin, daemon and worker pods (podman stats), and joins beside the other (kind joins workers
in parallel: the cluster takes no longer to make). Only on the kind backend; this module sorts before the others,
so its cluster is gone before theirs is made."""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kind_backend
import pytest
import yaml
from kindutil import DAEMONSET, NAMESPACE, ROOT, Cluster
from polling import wait_for_commands

pytestmark = pytest.mark.e2e
DRIVER = "gpu.dradriver.dev"
# docs/computedomains.md, "Running it" and "Simulation": the controller and the second driver, on nodes that are
# simulated GB200 trays of one NVLink clique (the sim preset's mixed profile has no fabric, so no channel device).
INSTALL_VALUES = ("computeDomains.enabled=true", "sim.profile=gb200-nvl72-tray")


@pytest.fixture(scope="module")
def two_workers(request: pytest.FixtureRequest) -> Iterator[kind_backend.KindRun]:
    """The cluster, its logs kept (path printed) when a test of the module failed, as conftest.kind_run's."""
    if kind_backend.backend() != "kind":
        pytest.skip("two kind workers run on the kind backend (E2E_BACKEND=kind)")
    work = Path(tempfile.mkdtemp(prefix="dradriver-kind-"))
    with kind_backend.kind_cluster(work, workers=2, install_values=INSTALL_VALUES) as kind:
        failed_before = request.session.testsfailed
        yield kind
        if request.session.testsfailed > failed_before:  # kind_cluster exports them only for its own failures
            print(f"kind e2e: logs of cluster {kind.name} in {kind.collect_logs()}")


def nodes(cluster: Cluster) -> dict[str, list[str]]:
    """The cluster's node names by role: control-plane, worker (sorted)."""
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    by_role: dict[str, list[str]] = {"control-plane": [], "worker": []}
    for node in items:
        labels = node["metadata"]["labels"]
        role = "control-plane" if "node-role.kubernetes.io/control-plane" in labels else "worker"
        by_role[role].append(node["metadata"]["name"])
    return {role: sorted(names) for role, names in by_role.items()}


def test_the_plugin_runs_on_the_workers_and_publishes_their_devices(two_workers: kind_backend.KindRun) -> None:
    cluster = two_workers.cluster()
    workers = nodes(cluster)["worker"]
    pods = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "json"))["items"]
    plugin = [p for p in pods if p["metadata"]["name"].startswith(DAEMONSET.split("/")[1])]
    assert sorted(p["spec"]["nodeName"] for p in plugin) == workers, plugin
    assert not any(p["spec"].get("hostNetwork") for p in plugin), "the chart's defaults: the pod network"
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
    assert {s["spec"]["nodeName"] for s in slices if s["spec"]["driver"] == DRIVER} == set(workers)


def test_a_pod_on_the_worker_resolves_names_through_coredns_on_the_control_plane(
    two_workers: kind_backend.KindRun,
) -> None:
    cluster = two_workers.cluster()
    by_role = nodes(cluster)
    [control_plane], worker = by_role["control-plane"], by_role["worker"][0]
    coredns = json.loads(cluster.kubectl("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "json"))
    there = [p["status"]["podIP"] for p in coredns["items"] if p["spec"].get("nodeName") == control_plane]
    assert there, "CoreDNS runs on the control plane (it tolerates its taint and started before the worker)"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lookup", "namespace": "default"},
        "spec": {
            "nodeName": worker,
            "restartPolicy": "Never",
            "containers": [{"name": "lookup", "image": "busybox:1.36",
                            "command": ["busybox", "nslookup", "kubernetes.default.svc.cluster.local", there[0]]}],
        },
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        phase = wait_for_commands("the lookup pod to finish", lambda: finished(cluster, "lookup"), 120)
        logs = cluster.kubectl("logs", "lookup")
        assert phase == "Succeeded" and "10.96.0.1" in logs, logs
    finally:
        cluster.kubectl("delete", "pod", "lookup", "--ignore-not-found", "--wait=false")


def finished(cluster: Cluster, pod: str) -> str | None:
    phase = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json"))["status"].get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_the_readme_scenario_runs_on_the_worker(two_workers: kind_backend.KindRun) -> None:
    rest = kind_backend.quickstart()[len(kind_backend.setup_commands()) :]
    printed = [two_workers.sh(line, timeout=300) for line in rest]
    assert any("DRADRIVER_DEVICE_" in out and "=GPU-" in out for out in printed), printed


EXAMPLE = ROOT / "examples/computedomains/two-node-job.yaml"
DOMAIN_LABEL = "resource.dradriver.dev/computeDomain"  # on a Node, a daemon pod, a DaemonSet: the domain's UID
CHANNELS = "/dev/nvidia-caps-imex-channels"
WORKERS = "two-node-job-workers"
# What the examples' workers print (docs/computedomains.md), in the busybox the kind node image preloads (the
# examples' ubuntu:22.04 cannot be pulled here); the trap ends the pod at once when it is deleted.
WORKER_SCRIPT = (f"ls -l {CHANNELS}/channel0; echo channels=$(ls {CHANNELS} | wc -l); env | grep COMPUTE_DOMAIN; "
                 "trap 'exit 0' TERM; sleep 3600 & wait")  # fmt: skip


def example_domain() -> dict[str, Any]:
    """The ComputeDomain of examples/computedomains/two-node-job.yaml, unedited (numNodes 2)."""
    [domain] = [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc["kind"] == "ComputeDomain"]
    assert domain["spec"]["numNodes"] == 2, domain
    return domain  # type: ignore[no-any-return]


def workload(domain: dict[str, Any]) -> dict[str, Any]:
    """Two replicas, one per node, each claiming a channel from the domain's template."""
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    labels = {"app": WORKERS}
    spread = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}},
            "resourceClaims": [{"name": "imex-channel", "resourceClaimTemplateName": template}],
            "containers": [{"name": "worker", "image": "busybox:1.36", "command": ["sh", "-c", WORKER_SCRIPT],
                            "resources": {"claims": [{"name": "imex-channel"}]}}],
        },
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKERS, "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": pod},
    }


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


def labelled_nodes(cluster: Cluster, uid: str) -> list[str]:
    return sorted(n["metadata"]["name"] for n in get(cluster, "nodes", "-l", f"{DOMAIN_LABEL}={uid}")["items"])


def off_the_nodes(cluster: Cluster, uid: str) -> bool:
    """No daemon pod of the domain, no Node labelled for it."""
    return not daemon_pods(cluster, uid) and not labelled_nodes(cluster, uid)


def daemon_pods(cluster: Cluster, uid: str) -> list[dict[str, Any]]:
    return get(cluster, "-n", NAMESPACE, "pods", "-l", f"{DOMAIN_LABEL}={uid}")["items"]  # type: ignore[no-any-return]


def test_a_compute_domain_spans_both_workers_and_is_cleaned_up(two_workers: kind_backend.KindRun) -> None:
    cluster = two_workers.cluster()
    workers = nodes(cluster)["worker"]
    domain = example_domain()
    name = domain["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(domain))
    try:
        uid = get(cluster, "computedomain", name)["metadata"]["uid"]
        cluster.kubectl("apply", "-f", "-", input=json.dumps(workload(domain)))
        try:
            cluster.kubectl("wait", "--for=condition=Ready", f"computedomain/{name}", "--timeout=300s", timeout=320)
            cluster.kubectl("rollout", "status", f"deployment/{WORKERS}", "--timeout=300s", timeout=320)
            entries = assert_domain_ready(cluster, name, workers)
            assert_daemons_running(cluster, uid, workers)
            assert_daemons_connected(cluster, uid, entries)
            assert_workers_hold_a_channel(cluster, uid, workers)
        finally:
            delete(cluster, "deployment", WORKERS)
        gone = functools.partial(off_the_nodes, cluster, uid)
        wait_for_commands("the daemon pods to go and the node labels to be removed", gone, 180)
    finally:
        delete(cluster, "computedomain", name)
    assert_nothing_left(cluster, domain, uid)


def delete(cluster: Cluster, kind: str, name: str) -> None:
    """Delete and wait until the object and (foreground) what it owns are gone."""
    cluster.kubectl("delete", kind, name, "--ignore-not-found", "--cascade=foreground", "--wait=true",
                    "--timeout=180s", timeout=200)  # fmt: skip


def assert_nothing_left(cluster: Cluster, domain: dict[str, Any], uid: str) -> None:
    """No DaemonSet, claim template or clique of the domain in the driver's namespace, its workload template gone,
    no Node labelled for it."""
    left = get(cluster, "-n", NAMESPACE, "daemonsets,resourceclaimtemplates", "-l", f"{DOMAIN_LABEL}={uid}")
    cliques = [c for c in get(cluster, "-n", NAMESPACE, "computedomaincliques")["items"]
               if c["metadata"]["name"].startswith(uid)]  # fmt: skip
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    templates = [t["metadata"]["name"] for t in get(cluster, "resourceclaimtemplates")["items"]]
    assert not left["items"] and not cliques and template not in templates, (left, cliques, templates)
    assert not labelled_nodes(cluster, uid)


def assert_domain_ready(cluster: Cluster, name: str, workers: list[str]) -> list[dict[str, Any]]:
    """The domain's status: Ready, with both workers Ready; its ``nodes`` entries returned."""
    status = get(cluster, "computedomain", name)["status"]
    print(f"--- computedomain {name}: status {status['status']}, nodes {json.dumps(status['nodes'])}")
    assert status["status"] == "Ready", status
    assert sorted(node["name"] for node in status["nodes"]) == workers, status
    assert all(node["status"] == "Ready" for node in status["nodes"]), status
    return status["nodes"]  # type: ignore[no-any-return]


def assert_daemons_running(cluster: Cluster, uid: str, workers: list[str]) -> None:
    pods = daemon_pods(cluster, uid)
    print("--- IMEX daemon pods:", [(p["metadata"]["name"], p["spec"]["nodeName"], p["status"]["phase"]) for p in pods])
    assert sorted(p["spec"]["nodeName"] for p in pods) == workers, pods
    assert all(p["status"]["phase"] == "Running" for p in pods), pods
    assert labelled_nodes(cluster, uid) == workers


def assert_daemons_connected(cluster: Cluster, uid: str, entries: list[dict[str, Any]]) -> None:
    """Each daemon's ``nvidia-imex-ctl -N`` (the simulated driver's, mounted by its claim) lists itself and the
    other node's daemon connected across the pod network, at the addresses and indices of the domain's status."""
    rows = {f"{e['index']} compute-domain-daemon-{e['index']:04d} {e['ipAddress']}": e["name"] for e in entries}
    for pod in daemon_pods(cluster, uid):
        node = pod["spec"]["nodeName"]
        want = {f"{row} {'I' if owner == node else 'C'}" for row, owner in rows.items()}
        table = functools.partial(imex_table, cluster, pod["metadata"]["name"], want)
        listed = wait_for_commands(f"{node}'s IMEX table", table, 60)
        print(f"--- {node}: nvidia-imex-ctl -N in its daemon pod:\n{listed}")


def imex_table(cluster: Cluster, pod: str, want: set[str]) -> str | None:
    """The daemon's node table once it is ``want``, else None."""
    table = cluster.kubectl("-n", NAMESPACE, "exec", pod, "--", "nvidia-imex-ctl", "-c", "/imexd/imexd.cfg", "-N")
    return table if set(table.splitlines()) == want else None


def assert_workers_hold_a_channel(cluster: Cluster, uid: str, workers: list[str]) -> None:
    pods = get(cluster, "pods", "-l", f"app={WORKERS}")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == workers, pods
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        log = wait_for_commands(f"{pod_name}'s report", functools.partial(reported, cluster, pod_name), 60)
        print(f"--- {pod['spec']['nodeName']}: {pod_name}'s output:\n{log}")
        assert f"{CHANNELS}/channel0" in log and "channels=1" in log.splitlines(), log
        assert f"COMPUTE_DOMAIN_UUID={uid}" in log.splitlines(), log


def reported(cluster: Cluster, pod: str) -> str | None:
    log = cluster.kubectl("logs", pod)
    return log if "COMPUTE_DOMAIN_UUID" in log else None
