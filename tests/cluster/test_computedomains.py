"""ComputeDomains end to end in the real control plane: the controller, two to three simulated GB200 trays
(both DRA drivers in each node process), IMEX daemons as local processes, the IMEX stand-in. docs/computedomains.md."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cd_cluster import (
    CONTROLLER_ACCOUNT,
    DAEMON_ACCOUNT,
    NAMESPACE,
    CdNode,
    ControllerRun,
    account_kubeconfig,
    install_chart_parts,
    refusals,
)
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.computedomain import api
from dradriver.computedomain.controller import Controller, ControllerSettings
from dradriver.computedomain.kube import Rest, path_of
from dradriver.sim import imex_standin
from dradriver.sim.fabric import IMEX_CHANNELS_MAJOR

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 90.0
USER_NS = "default"


def _kubectl(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def cd_cluster(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    kube = control_plane.kube
    install_chart_parts(control_plane)
    daemons = account_kubeconfig(control_plane, DAEMON_ACCOUNT, control_plane.root / "cd-daemon.kubeconfig")
    controller_kubeconfig = account_kubeconfig(
        control_plane, CONTROLLER_ACCOUNT, control_plane.root / "cd-controller.kubeconfig"
    )
    nodes: dict[str, CdNode] = {}
    controller = ControllerRun(controller_kubeconfig, control_plane.logs / "cd-controller.log", "controller-a")
    cluster: dict[str, Any] = {
        "kube": kube, "nodes": nodes, "controller": controller, "plane": control_plane,
        "controller_kubeconfig": controller_kubeconfig,
    }  # fmt: skip
    # Loopback addresses of this run's own (all of 127.0.0.0/8 is local): IMEX ports never meet another run's.
    subnet = f"127.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
    try:
        for i, name in enumerate(("tray-a", "tray-b", "tray-c"), start=1):
            nodes[name] = CdNode.start(
                control_plane,
                daemons,
                control_plane.root / name,
                name,
                ip=f"{subnet}.{i}",
                profile="gb200-nvl72-tray",
            )
        yield cluster
    finally:
        cluster["controller"].stop()  # the standby, after the failover test
        for node in nodes.values():
            (control_plane.logs / f"dradriver-{node.name}.log").write_text(node.node.driver.log)
            node.stop()


@pytest.fixture(autouse=True)
def leftovers(cd_cluster: dict[str, Any]) -> Iterator[None]:
    """What a test left of its workloads and domains, deleted after it even when it failed: a pod or domain left
    behind would hold the trays' channels and fail the next test instead."""
    yield
    kube: Kube = cd_cluster["kube"]
    trays = set(cd_cluster["nodes"])
    pods = [
        p["metadata"]["name"]
        for p in kube.list("pods", USER_NS)
        if p["spec"].get("nodeName") in trays
        or (p["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname") in trays
    ]
    domains = [d["metadata"]["name"] for d in kube.list("computedomains", USER_NS)]
    for name in pods:
        kube.delete("pods", name, USER_NS)
    for name in domains:
        kube.delete("computedomains", name, USER_NS)
    for name in pods:
        _wait_gone(kube, "pods", name)
    for name in domains:
        _wait_gone(kube, "computedomains", name)


def _domain(kube: Kube, name: str, template: str, *, num_nodes: int = 2, mode: str = "Single") -> dict[str, Any]:
    return kube.create(
        "computedomains",
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": name},
            "spec": {
                "numNodes": num_nodes,
                "channel": {"resourceClaimTemplate": {"name": template}, "allocationMode": mode},
            },
        },
        USER_NS,
    )


def _pod(kube: Kube, name: str, template: str, node: str) -> dict[str, Any]:
    return kube.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "channel"}]},
                    }
                ],
            },
        },
        USER_NS,
    )


def _running(cluster: dict[str, Any], node: str, pod: dict[str, Any]) -> Any:
    runner = cluster["nodes"][node].runner
    return runner.pods.get(pod["metadata"]["uid"])


def _wait_gone(kube: Kube, plural: str, name: str, namespace: str = USER_NS) -> None:
    kube.wait(f"{plural} {name} to be gone", lambda: kube.find(plural, name, namespace) is None, TIMEOUT)


def _job(cluster: dict[str, Any], name: str, mode: str, nodes: tuple[str, ...]) -> tuple[dict[str, Any], list[Any]]:
    kube: Kube = cluster["kube"]
    domain = _domain(kube, name, f"{name}-channel", num_nodes=len(nodes), mode=mode)
    kube.wait("the workload claim template", lambda: kube.find("resourceclaimtemplates", f"{name}-channel", USER_NS))
    pods = [_pod(kube, f"{name}-{i}", f"{name}-channel", node) for i, node in enumerate(nodes)]
    try:
        running = [
            kube.wait(f"pod {p['metadata']['name']} running", lambda p=p, n=n: _running(cluster, n, p), TIMEOUT)
            for p, n in zip(pods, nodes, strict=True)
        ]
    except TimeoutError:
        _assert_no_refusals(cluster)  # the likelier cause, named
        raise
    return domain, running


def _delete_pods(cluster: dict[str, Any], name: str, count: int) -> None:
    kube: Kube = cluster["kube"]
    for i in range(count):
        kube.delete("pods", f"{name}-{i}", USER_NS)
    for i in range(count):
        _wait_gone(kube, "pods", f"{name}-{i}")


def _assert_no_refusals(cluster: dict[str, Any]) -> None:
    """Nothing the plugin, the daemons or the controller asked for was refused by the chart's RBAC."""
    logs = {"controller": cluster["controller"].log.read_text()}
    for node in cluster["nodes"].values():
        logs[f"plugin {node.name}"] = node.node.driver.log
        for pod in node.runner.pods.values():
            if pod.log is not None:
                logs[f"daemon {pod.name}"] = pod.log.read_text()
    refused = {who: lines for who, log in logs.items() if (lines := refusals(log))}
    assert not refused, refused


def _samples(controller: ControllerRun) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The controller's /metrics: (sample name, sorted labels) → value."""
    code, text = controller.get("/metrics")
    assert code == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labelled(kube: Kube, uid: str) -> set[str]:
    return {n["metadata"]["name"] for n in kube.list("nodes", labelSelector=f"{api.DOMAIN_LABEL}={uid}")}


@pytest.mark.parametrize("mode", ["Single", "All"])
def test_a_two_node_job_runs_with_its_channels_and_leaves_nothing_behind(cd_cluster: dict[str, Any], mode: str) -> None:
    kube: Kube = cd_cluster["kube"]
    name = f"job-{mode.lower()}"
    domain, running = _job(cd_cluster, name, mode, ("tray-a", "tray-b"))
    uid = domain["metadata"]["uid"]
    for pod in running:
        nodes = pod.container.device_nodes
        assert len(nodes) == (1 if mode == "Single" else api.MAX_IMEX_CHANNELS)
        assert nodes[0] == {
            "path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c", "major": IMEX_CHANNELS_MAJOR, "minor": 0,
            "fileMode": 0o666,
        }  # fmt: skip
    # The domain is Ready with both daemons numbered in one clique; kubectl wait understands its condition.
    _kubectl(
        cd_cluster["plane"], "wait", "-n", USER_NS, "--for=condition=Ready", f"computedomain/{name}", "--timeout=60s"
    )
    status = kube.get("computedomains", name, USER_NS)["status"]
    assert status["status"] == "Ready"
    assert sorted(n["index"] for n in status["nodes"]) == [0, 1]
    assert {n["name"] for n in status["nodes"]} == {"tray-a", "tray-b"}
    daemons_ready = next(c for c in status["conditions"] if c["type"] == "DaemonsReady")
    assert daemons_ready["status"] == "True" and daemons_ready["message"] == "2/2 Ready"
    # The controller's own metrics and probes say the same (the domains gauge is its next pass's reading).
    controller = cd_cluster["controller"]
    ready_domains = ("dradriver_computedomains", (("status", "Ready"),))
    kube.wait("the controller's metrics to count the Ready domain",
              lambda: _samples(controller).get(ready_domains, 0) >= 1, TIMEOUT)  # fmt: skip
    samples = _samples(controller)
    assert samples[("dradriver_computedomain_controller_leading", ())] == 1
    assert samples[("dradriver_computedomain_controller_passes_total", (("outcome", "ok"),))] >= 1
    writes = ("dradriver_computedomain_api_writes_total", (("resource", "daemonsets"), ("verb", "POST")))
    assert samples[writes] >= 1
    assert controller.get("/livez") == (200, "ok\n")
    code, body = controller.get("/readyz")
    assert code == 200 and json.loads(body) == {"ready": True, "leading": True}
    # The IMEX daemons found each other through the names in their hosts files. The domain's Ready says each daemon
    # is Ready, not that they have connected yet (a daemon reads its clique every 0.5 s): polled, within TIMEOUT.
    daemon = cd_cluster["nodes"]["tray-a"].runner.daemon()

    def peers() -> list[str]:
        table = subprocess.run(
            [*imex_standin.ctl_command(), "-c", f"{daemon.container.mounts['/imexd']}/imexd.cfg", "-N"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return sorted(line.split()[-1] for line in table.splitlines())

    kube.wait("the IMEX daemons to connect", lambda: peers() == ["C", "I"], TIMEOUT)
    assert peers() in (["C", "I"], ["I", "C"])
    _assert_no_refusals(cd_cluster)

    _delete_pods(cd_cluster, name, 2)
    kube.wait("node labels removed", lambda: not _labelled(kube, uid), TIMEOUT)
    kube.delete("computedomains", name, USER_NS)
    _wait_gone(kube, "computedomains", name)
    _wait_gone(kube, "daemonsets", api.daemon_object_name(uid), NAMESPACE)
    kube.wait(
        "daemon pods gone", lambda: not kube.list("pods", NAMESPACE, labelSelector=f"{api.DOMAIN_LABEL}={uid}"), TIMEOUT
    )
    kube.wait(
        "cliques gone",
        lambda: not kube.list("computedomaincliques", NAMESPACE, labelSelector=f"{api.DOMAIN_LABEL}={uid}"),
        TIMEOUT,
    )


def test_deleting_a_domain_with_pods_still_running_never_hangs(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    domain, _ = _job(cd_cluster, "doomed", "Single", ("tray-a", "tray-b"))
    uid = domain["metadata"]["uid"]
    kube.delete("computedomains", "doomed", USER_NS)
    _wait_gone(kube, "computedomains", "doomed")
    assert not _labelled(kube, uid)
    kube.wait(
        "daemons stopped", lambda: not kube.list("pods", NAMESPACE, labelSelector=f"{api.DOMAIN_LABEL}={uid}"), TIMEOUT
    )
    # The workload pods end afterwards; unprepare needs no domain.
    _delete_pods(cd_cluster, "doomed", 2)
    assert not cd_cluster["nodes"]["tray-a"].runner.errors


def test_a_crashed_daemon_is_restarted_and_keeps_its_index(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    _job(cd_cluster, "crash", "Single", ("tray-a", "tray-b"))
    runner = cd_cluster["nodes"]["tray-b"].runner
    before = {n["name"]: n["index"] for n in kube.get("computedomains", "crash", USER_NS)["status"]["nodes"]}
    daemon = runner.crash_daemon()
    kube.wait("the daemon restarted", lambda: daemon.starts >= 2, TIMEOUT)

    def ready_again() -> Any:
        status = kube.get("computedomains", "crash", USER_NS).get("status", {})
        return status.get("status") == "Ready" and {n["name"]: n["index"] for n in status["nodes"]} == before

    kube.wait("the domain Ready again with the same indices", ready_again, TIMEOUT)
    _delete_pods(cd_cluster, "crash", 2)
    kube.delete("computedomains", "crash", USER_NS)
    _wait_gone(kube, "computedomains", "crash")


def test_two_domains_share_a_clique_but_never_a_node(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    first, _ = _job(cd_cluster, "first", "Single", ("tray-a",))
    second, _ = _job(cd_cluster, "second", "Single", ("tray-c",))
    assert _labelled(kube, first["metadata"]["uid"]) == {"tray-a"}
    assert _labelled(kube, second["metadata"]["uid"]) == {"tray-c"}
    # A pod of the second domain cannot join the first one's node: its one channel device is taken.
    _pod(kube, "second-intruder", "second-channel", "tray-a")

    def unschedulable() -> bool:
        conditions = kube.get("pods", "second-intruder", USER_NS).get("status", {}).get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    kube.wait("the intruder to be unschedulable", unschedulable, TIMEOUT)
    kube.delete("pods", "second-intruder", USER_NS)
    _wait_gone(kube, "pods", "second-intruder")
    _delete_pods(cd_cluster, "first", 1)
    _delete_pods(cd_cluster, "second", 1)
    for name in ("first", "second"):
        kube.delete("computedomains", name, USER_NS)
        _wait_gone(kube, "computedomains", name)


def test_the_spec_is_immutable(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    _domain(kube, "fixed", "fixed-channel")
    done = _kubectl(cd_cluster["plane"], "patch", "-n", USER_NS, "computedomain/fixed", "--type=merge",
                    "-p", '{"spec":{"numNodes":3}}', check=False)  # fmt: skip
    assert done.returncode != 0 and "A computeDomain.spec is immutable" in done.stderr
    kube.delete("computedomains", "fixed", USER_NS)
    _wait_gone(kube, "computedomains", "fixed")


def test_a_restarted_controller_leaves_a_converged_domain_alone(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    plane: ControlPlane = cd_cluster["plane"]
    _job(cd_cluster, "steady", "Single", ("tray-a", "tray-b"))
    kube.wait("Ready", lambda: kube.get("computedomains", "steady", USER_NS).get("status", {}).get("status") == "Ready")
    cd_cluster["controller"].stop()  # a clean stop hands the Lease back
    before = kube.get("computedomains", "steady", USER_NS)["metadata"]["resourceVersion"]
    clique = kube.list("computedomaincliques", NAMESPACE)[0]["metadata"]["resourceVersion"]
    restarted = ControllerRun(
        cd_cluster["controller_kubeconfig"], plane.logs / "cd-controller-restarted.log", "controller-a"
    )
    cd_cluster["controller"] = restarted
    kube.wait(
        "the restarted controller to lead",
        lambda: (
            kube.get("leases", "dradriver-compute-domain-controller", NAMESPACE)["spec"].get("holderIdentity")
            == "controller-a"
        ),
    )
    # A domain made after the restart gets its status in one pass and is deleted in a later one: by then the
    # first pass has gone over the steady domain too.
    _domain(kube, "marker", "marker-channel", num_nodes=0)
    kube.wait("a pass", lambda: kube.get("computedomains", "marker", USER_NS).get("status"), TIMEOUT)
    kube.delete("computedomains", "marker", USER_NS)
    _wait_gone(kube, "computedomains", "marker")
    assert kube.get("computedomains", "steady", USER_NS)["metadata"]["resourceVersion"] == before
    assert kube.list("computedomaincliques", NAMESPACE)[0]["metadata"]["resourceVersion"] == clique
    _delete_pods(cd_cluster, "steady", 2)
    kube.delete("computedomains", "steady", USER_NS)
    _wait_gone(kube, "computedomains", "steady")


def test_the_controller_fails_over_to_a_standby(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    plane: ControlPlane = cd_cluster["plane"]
    standby = ControllerRun(cd_cluster["controller_kubeconfig"], plane.logs / "cd-controller-b.log", "controller-b")
    try:
        cd_cluster["controller"].stop(9)  # no clean release: the standby waits out the lease
        _domain(kube, "after-failover", "after-failover-channel", num_nodes=0)
        kube.wait(
            "the standby to reconcile",
            lambda: kube.find("resourceclaimtemplates", "after-failover-channel", USER_NS),
            TIMEOUT,
        )
        lease = kube.get("leases", "dradriver-compute-domain-controller", NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "controller-b"
        kube.delete("computedomains", "after-failover", USER_NS)
        _wait_gone(kube, "computedomains", "after-failover")
    finally:
        cd_cluster["controller"] = standby


def test_fifty_daemons_join_one_clique_without_a_conflict(cd_cluster: dict[str, Any]) -> None:
    """Each daemon applies only its own entry; the controller numbers them: no write is ever refused."""
    plane: ControlPlane = cd_cluster["plane"]
    rest = Rest.from_kubeconfig(str(plane.kubeconfig))
    clique = path_of(api.API_VERSION, "computedomaincliques", NAMESPACE, "storm.clique")
    errors: list[Exception] = []

    def join(i: int) -> None:
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomainClique",
            "metadata": {"name": "storm.clique", "namespace": NAMESPACE},
            "daemons": [{"nodeName": f"node-{i:02d}", "ipAddress": f"10.0.1.{i}", "cliqueID": "c", "status": "Ready"}],
        }
        try:
            rest.apply(clique, body, manager=f"cd-daemon-node-{i:02d}")
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(50)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert rest.writes == {"PATCH computedomaincliques": 50}
        stored = rest.get(clique)
        assert len(stored["daemons"]) == 50
        numbered = Controller(rest, ControllerSettings(namespace=NAMESPACE, image="x", max_nodes_per_domain=64))
        result = numbered._assign_indices(stored, stored["daemons"])
        indices = sorted(d["index"] for d in result["daemons"])
        assert indices == list(range(50))
        # The daemons' own fields survive the controller's apply; a daemon's later update keeps its index.
        assert all(d["status"] == "Ready" and d["ipAddress"] for d in result["daemons"])
    finally:
        rest.delete(clique)  # a clique of nobody's domain: gone before the next test counts cliques
        rest.close()


@pytest.mark.parametrize(
    ("spec", "count"), [("channel-injection", 1), ("channel-injection-all", api.MAX_IMEX_CHANNELS)]
)
def test_nvidias_imex_demo_with_our_api_version_runs(cd_cluster: dict[str, Any], spec: str, count: int) -> None:
    kube: Kube = cd_cluster["kube"]
    path = REPO / "examples" / "computedomains" / f"{spec}.yaml"
    _kubectl(cd_cluster["plane"], "apply", "-n", USER_NS, "-f", str(path))
    pod = kube.wait("the demo pod", lambda: kube.find("pods", f"imex-{spec}", USER_NS), TIMEOUT)

    def running() -> Any:
        node = kube.get("pods", f"imex-{spec}", USER_NS)["spec"].get("nodeName")
        return node in cd_cluster["nodes"] and _running(cd_cluster, node, pod)

    kube.wait("the demo pod running", running, TIMEOUT)
    node = kube.get("pods", f"imex-{spec}", USER_NS)["spec"]["nodeName"]
    assert len(_running(cd_cluster, node, pod).container.device_nodes) == count
    _kubectl(cd_cluster["plane"], "delete", "-n", USER_NS, "--wait=false", "-f", str(path))
    _wait_gone(kube, "pods", f"imex-{spec}")
    _wait_gone(kube, "computedomains", f"imex-{spec}")


def test_a_node_joins_a_running_domain_and_one_leaves_it(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    domain, _ = _job(cd_cluster, "grow", "Single", ("tray-a", "tray-b"))
    uid = domain["metadata"]["uid"]
    # A third worker: tray-c's daemon joins with the next index, and the others learn its name.
    third = _pod(kube, "grow-2", "grow-channel", "tray-c")
    kube.wait("the third worker running", lambda: _running(cd_cluster, "tray-c", third), TIMEOUT)

    def mesh(node: str, size: int) -> bool:
        daemon = cd_cluster["nodes"][node].runner.daemon()
        if daemon is None:
            return False
        table = subprocess.run(
            [*imex_standin.ctl_command(), "-c", f"{daemon.container.mounts['/imexd']}/imexd.cfg", "-N"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout  # fmt: skip
        return sorted(line.split()[-1] for line in table.splitlines()) == ["C"] * (size - 1) + ["I"]

    kube.wait("tray-a's IMEX daemon connected to both peers", lambda: mesh("tray-a", 3), TIMEOUT)
    indices = {n["name"]: n["index"] for n in kube.get("computedomains", "grow", USER_NS)["status"]["nodes"]}
    assert indices["tray-c"] == 2  # the next free one (a and b hold 0 and 1, in the order they joined)
    # tray-b's worker ends: its daemon goes, its entry leaves the clique, the others keep their indices.
    kube.delete("pods", "grow-1", USER_NS)
    _wait_gone(kube, "pods", "grow-1")

    def shrunk() -> bool:
        nodes = kube.get("computedomains", "grow", USER_NS)["status"]["nodes"]
        return {n["name"]: n["index"] for n in nodes} == {"tray-a": indices["tray-a"], "tray-c": 2}

    kube.wait("tray-b gone from the domain", shrunk, TIMEOUT)
    assert _labelled(kube, uid) == {"tray-a", "tray-c"}
    kube.delete("pods", "grow-0", USER_NS)
    kube.delete("pods", "grow-2", USER_NS)
    _wait_gone(kube, "pods", "grow-0")
    _wait_gone(kube, "pods", "grow-2")
    kube.delete("computedomains", "grow", USER_NS)
    _wait_gone(kube, "computedomains", "grow")


def test_a_fabric_being_registered_again_withdraws_the_channel_until_it_is_done(cd_cluster: dict[str, Any]) -> None:
    kube: Kube = cd_cluster["kube"]
    node = cd_cluster["nodes"]["tray-c"].node
    sim = [sys.executable, "-m", "dradriver", "sim", "--sim-profile", "gb200-nvl72-tray",
           "--sim-state", str(node.root / "sim.json"), "--node-name", "tray-c", "fabric", "0"]  # fmt: skip

    def devices() -> list[str]:
        slices = kube.list("resourceslices", fieldSelector=f"spec.driver={api.DRIVER_NAME},spec.nodeName=tray-c")
        return [d["name"] for s in slices for d in s["spec"].get("devices") or []]

    kube.wait("the devices published", lambda: devices() == ["channel-0", "daemon-0"], TIMEOUT)
    subprocess.run([*sim, "IN_PROGRESS"], check=True, capture_output=True, timeout=60)
    kube.wait("the devices withdrawn", lambda: devices() == [], TIMEOUT)
    subprocess.run([*sim, "COMPLETED"], check=True, capture_output=True, timeout=60)
    kube.wait("the devices back", lambda: devices() == ["channel-0", "daemon-0"], TIMEOUT)
