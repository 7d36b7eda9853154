"""The driver and the kubelet restarted under running pods, and a rolling update of the driver, on the real
kubelet: pods keep running, the kubelet registers the new plugin instance, nothing is prepared twice or leaked,
and later deletions still unprepare."""

from __future__ import annotations

import signal
from typing import Any

from support.kube_rest import Kube
from support.node_pods import Workloads, cdi_specs_of, claims_of, running
from support.real_node import RealNode, wait_for

from node.test_pods import GPU_CLASS, MIG_CLASS, NAMESPACE, pod, sim_show, template, unique, wait_unprepared


def one_gpu_pod(name: str, device_class: str = GPU_CLASS) -> list[dict[str, Any]]:
    return [template(name, device_class), pod(name, {"gpu": {"resourceClaimTemplateName": name}}, command="true")]


def still_running(kube: Kube, before: dict[str, Any]) -> None:
    after = kube.get("pods", before["metadata"]["name"], NAMESPACE)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert running(after), after.get("status")
    assert [s.get("restartCount") for s in after["status"]["containerStatuses"]] == [0]


def failed_prepares(workloads: Workloads, pods: list[dict[str, Any]]) -> list[str]:
    return [e for p in pods for e in workloads.events(p) if e.startswith("FailedPrepareDynamicResources")]


def test_a_driver_killed_and_restarted_leaves_pods_running_and_still_unprepares(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    first, second = one_gpu_pod(unique("kill")), one_gpu_pod(unique("after-kill"))
    workloads.apply(first)
    claims: list[dict[str, Any]] = []
    try:
        [before] = workloads.wait_running(first[1])
        claims += claims_of(kube, before)
        node.stop_driver(node.driver, signal.SIGKILL)
        node.start_driver()  # returns once the kubelet has registered it
        still_running(kube, before)
        workloads.apply(second)
        [other] = workloads.wait_running(second[1])
        claims += claims_of(kube, other)
        assert failed_prepares(workloads, [before, other]) == []
    finally:
        if not any(driver.proc.poll() is None for driver in node.drivers):
            node.start_driver()  # the restart failed: the pods' claims and the tests after this one need a driver
        workloads.delete([*reversed(first), *reversed(second)])
    for claim in claims:
        wait_unprepared(node, kube, claim)


def test_a_restarted_kubelet_prepares_nothing_twice_and_leaks_nothing(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    # A MIG partition: a second prepare of the claim would carve a second one.
    docs = one_gpu_pod(unique("kubelet"), MIG_CLASS)
    workloads.apply(docs)
    try:
        [before] = workloads.wait_running(docs[1])
        [claim] = claims_of(kube, before)
        uid = claim["metadata"]["uid"]
        [spec] = cdi_specs_of(node, uid)
        content = spec.read_text()
        registered = node.registrations()
        node.restart_kubelet()
        wait_for("the restarted kubelet to register the driver again", lambda: node.registrations() > registered, 90)
        # The restarted kubelet syncs the pod again (and may prepare its claim again: the same answer).
        wait_for("the restarted kubelet to report the node Ready", node.ready, 90)
        still_running(kube, before)
        assert cdi_specs_of(node, uid) == [spec] and spec.read_text() == content
        assert sim_show(node).count(uid) == 1, sim_show(node)
        assert uid in node.prepared_claims()
    finally:
        workloads.delete(reversed(docs))
    wait_unprepared(node, kube, claim)
    assert uid not in node.prepared_claims() and uid not in sim_show(node)


def test_a_rolling_update_moves_the_kubelet_to_the_new_instance_without_a_failed_prepare(
    node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    # Rolling-update mode: each instance names its sockets after its pod UID (--pod-uid), so two can run.
    node.stop_driver(node.driver)
    old = node.start_driver(pod_uid="rollout-old")
    first, second = one_gpu_pod(unique("roll-a")), one_gpu_pod(unique("roll-b"))
    claims: list[dict[str, Any]] = []
    try:
        workloads.apply(first)
        [before] = workloads.wait_running(first[1])
        claims += claims_of(kube, before)
        new = node.start_driver(pod_uid="rollout-new")  # beside the old one; returns once registered
        node.stop_driver(old)
        still_running(kube, before)
        workloads.apply(second)
        [other] = workloads.wait_running(second[1])
        claims += claims_of(kube, other)
        workloads.delete([*reversed(first), *reversed(second)])
        for claim in claims:
            wait_unprepared(node, kube, claim)
        # The old instance is gone: the new one prepared the second pod's claim and unprepared both.
        assert failed_prepares(workloads, [before, other]) == []
        assert new.proc.poll() is None
    finally:
        workloads.delete([*reversed(first), *reversed(second)])
        for driver in list(node.drivers):
            if driver.proc.poll() is None:
                node.stop_driver(driver)
        node.start_driver()
