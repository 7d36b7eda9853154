"""End to end with the simulated driver: every example scenario is applied and its containers report the devices
they received; the driver survives a rolling update while a pod holds a GPU; dynamic MIG carves and frees
partitions. The same bodies run on kind (the sim overlay's DaemonSet) where Docker and kind exist, and on the
local node (a real kubelet and containerd, the driver as a host process) elsewhere: see conftest.py."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from kindutil import ROOT, Backend, header, workloads

pytestmark = pytest.mark.e2e
SCENARIOS = sorted((ROOT / "examples/scenarios").glob("*.yaml"))
DRIVER = "gpu.dradriver.dev"


def namespace_of(workload: dict[str, Any]) -> str:
    return str(workload["metadata"].get("namespace", "default"))


def wait_running(cluster: Backend, workload: dict[str, Any]) -> list[str]:
    """Wait until the workload's pods are Ready; their names."""
    ns, name = namespace_of(workload), workload["metadata"]["name"]
    if workload["kind"] == "Deployment":
        cluster.kubectl("-n", ns, "rollout", "status", f"deployment/{name}", "--timeout=240s", timeout=260)
        labels = ",".join(f"{k}={v}" for k, v in workload["spec"]["selector"]["matchLabels"].items())
        pods = json.loads(cluster.kubectl("-n", ns, "get", "pods", "-l", labels, "-o", "json"))["items"]
        return [p["metadata"]["name"] for p in pods]
    try:
        cluster.kubectl("-n", ns, "wait", f"pod/{name}", "--for=condition=Ready", "--timeout=240s", timeout=260)
    except AssertionError as err:
        # Why it never ran (the scheduler's or kubelet's events, the claim's allocation) is in the description.
        described = cluster.kubectl("-n", ns, "describe", "pod", name)
        claims = cluster.kubectl("-n", ns, "get", "resourceclaims", "-o", "wide")
        raise AssertionError(f"{err}\n{described}\n{claims}") from None
    return [name]


def container_logs(cluster: Backend, namespace: str, pod: str, lines: int = 1, timeout: float = 60) -> str:
    """Every container's output once it has at least ``lines`` lines: a container that is Ready may not have
    written its report yet (on a loaded node), so poll for it."""
    deadline = time.monotonic() + timeout
    while True:
        logs = cluster.kubectl("-n", namespace, "logs", pod, "--all-containers")
        if len(logs.splitlines()) >= lines or time.monotonic() > deadline:
            return logs
        time.sleep(0.5)


def allocated_devices(cluster: Backend, namespace: str, pod: str) -> list[dict[str, Any]]:
    statuses = json.loads(cluster.kubectl("-n", namespace, "get", "pod", pod, "-o", "json"))["status"]
    names = [s["resourceClaimName"] for s in statuses.get("resourceClaimStatuses", []) if s.get("resourceClaimName")]
    results: list[dict[str, Any]] = []
    for claim in names:
        obj = json.loads(cluster.kubectl("-n", namespace, "get", "resourceclaim", claim, "-o", "json"))
        results += obj["status"]["allocation"]["devices"]["results"]
    return results


def test_the_driver_publishes_the_simulated_node(cluster: Backend) -> None:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
    nodes = cluster.own_nodes()
    own = [s for s in slices if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") in nodes]
    devices = [d for s in own for d in s["spec"].get("devices", [])]
    kinds = {d["attributes"]["type"]["string"] for d in devices}
    assert kinds == {"gpu", "mig"}, kinds  # mixed profile, dynamic MIG


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_example_runs_and_its_containers_get_their_devices(cluster: Backend, path: Path) -> None:
    needs = header(path, "Needs")
    expect = re.compile(header(path, "Expect") or "^DRADRIVER_DEVICE_")
    second_driver = cluster.with_driver(needs) if needs else contextlib.nullcontext()
    with cluster.configured(header(path, "Node") or cluster.node_config), second_driver:
        cluster.apply(path)
        try:
            for workload in workloads(path):
                for pod in wait_running(cluster, workload):
                    spec = workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]
                    logs = container_logs(cluster, namespace_of(workload), pod, lines=len(spec["containers"]))
                    assert len(logs.splitlines()) >= len(spec["containers"]), logs  # one report per container
                    for line in logs.splitlines():
                        assert expect.search(line), f"{pod}: {line!r} does not match {expect.pattern!r}"
        finally:
            cluster.delete(path)


def test_a_rolling_update_keeps_a_held_gpu_and_serves_new_pods(cluster: Backend) -> None:
    example = ROOT / "examples/scenarios/01-one-gpu.yaml"
    second = ROOT / "examples/scenarios/06-any-gpu-40gi.yaml"
    cluster.apply(example)
    try:
        [pod] = wait_running(cluster, workloads(example)[0])
        before = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json"))
        cluster.roll_driver()
        after = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json"))
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        assert after["status"]["phase"] == "Running"
        # The new plugin pod prepares new claims and unprepares the old one.
        cluster.apply(second)
        [other] = wait_running(cluster, workloads(second)[0])
        assert re.search(r"^DRADRIVER_DEVICE_\S+=GPU-", container_logs(cluster, "default", other), re.M)
    finally:
        try:
            cluster.delete(second)  # never applied when the roll failed: deleting nothing is no error
        finally:
            cluster.delete(example)


def test_dynamic_mig_carves_partitions_on_one_parent_and_frees_them(cluster: Backend) -> None:
    example = ROOT / "examples/scenarios/07-mig-partitions-one-parent.yaml"
    for _round in range(2):  # the second round finds the partitions of the first destroyed and free again
        cluster.apply(example)
        try:
            [pod] = wait_running(cluster, workloads(example)[0])
            results = allocated_devices(cluster, "default", pod)
            assert len(results) == 2 and all("-mig-1g5gb-" in r["device"] for r in results), results
            logs = container_logs(cluster, "default", pod)
            assert len(re.findall(r"^DRADRIVER_DEVICE_\S+=MIG-", logs, re.M)) == 2, logs
        finally:
            cluster.delete(example)
