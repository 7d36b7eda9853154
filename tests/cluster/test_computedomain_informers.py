"""The ComputeDomain controller on informers, measured in the real control plane: with 50 domains, a new domain's
DaemonSet within a second, no list or get while idle, and a restart that converges what changed while it was down.

The controller runs as a process on the chart's service account (as in test_computedomains.py); domains have no
nodes here (their DaemonSets run no pods), which is all the controller's side needs. The figures are printed
(``pytest -s``) and recorded in docs/performance.md ("ComputeDomain controller").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cd_cluster import CONTROLLER_ACCOUNT, NAMESPACE, ControllerRun, account_kubeconfig, install_chart_parts
from support.control_plane import ControlPlane
from support.kube_rest import Kube

from dradriver.computedomain import api

USER_NS = "default"
LABEL = "dradriver.dev/test"
VALUE = "informers"
DOMAINS = 50  # the background: more than every other ComputeDomain test together
NEW = 10  # new domains timed one after the other
LEASE = "dradriver-compute-domain-controller"
TIMEOUT = 90.0
IDLE_WINDOW = 12.0
# Watches asked to end after 5 to 10 s (--watch-timeout): the idle window sees every informer watch again.
WATCH_TIMEOUT = ("--watch-timeout", "5")
INFORMERS = 6  # domains, cliques, daemon pods, DaemonSets, claim templates, labelled nodes


def _create(kube: Kube, name: str) -> dict[str, Any]:
    return kube.create(
        "computedomains",
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": name, "labels": {LABEL: VALUE}},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
        },
        USER_NS,
    )


def _daemonset(kube: Kube, domain: dict[str, Any]) -> dict[str, Any] | None:
    return kube.find("daemonsets", api.daemon_object_name(domain["metadata"]["uid"]), NAMESPACE)


def _counts(controller: ControllerRun) -> dict[tuple[str, str, str], float]:
    """The controller's requests so far: (reads|writes, verb, resource) → count."""
    code, text = controller.get("/metrics")
    assert code == 200
    counts: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("dradriver_computedomain_api_reads", "dradriver_computedomain_api_writes"):
            kind = family.name.rsplit("_", 1)[-1]
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[(kind, sample.labels["verb"], sample.labels["resource"])] = sample.value
    return counts


def _rss_mib(controller: ControllerRun) -> float:
    for line in Path(f"/proc/{controller.proc.pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _lead(kube: Kube, identity: str) -> None:
    kube.wait(
        f"{identity} to lead",
        lambda: (kube.find("leases", LEASE, NAMESPACE) or {}).get("spec", {}).get("holderIdentity") == identity,
        TIMEOUT,
    )


@pytest.fixture(scope="module")
def informed(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    """The controller leading, and DOMAINS domains with their DaemonSets (made in one burst, timed)."""
    kube = control_plane.kube
    install_chart_parts(control_plane)
    kubeconfig = account_kubeconfig(control_plane, CONTROLLER_ACCOUNT, control_plane.root / "cd-informers.kubeconfig")
    state: dict[str, Any] = {"kube": kube, "plane": control_plane, "kubeconfig": kubeconfig}
    state["controller"] = ControllerRun(
        kubeconfig, control_plane.logs / "cd-controller-informers.log", "informers", extra=WATCH_TIMEOUT
    )
    try:
        _lead(kube, "informers")
        started = time.monotonic()
        state["domains"] = [_create(kube, f"informer-{i:03d}") for i in range(DOMAINS)]
        for domain in state["domains"]:
            kube.wait("every DaemonSet", lambda d=domain: _daemonset(kube, d), TIMEOUT)
        state["burst_s"] = time.monotonic() - started
        state["burst_writes"] = {
            f"{verb} {resource}": count
            for (kind, verb, resource), count in _counts(state["controller"]).items()
            if kind == "writes" and resource != "leases"
        }
        yield state
    finally:
        kube.delete_all("computedomains", USER_NS, labelSelector=f"{LABEL}={VALUE}")
        kube.wait(
            "the test's domains to be gone (the controller lets them go)",
            lambda: not kube.list("computedomains", USER_NS, labelSelector=f"{LABEL}={VALUE}"),
            TIMEOUT,
        )
        state["controller"].stop()


def test_a_new_domain_gets_its_daemonset_within_a_second(informed: dict[str, Any]) -> None:
    kube: Kube = informed["kube"]
    latencies = []
    for i in range(NEW):
        created = _create(kube, f"informer-new-{i}")
        started = time.monotonic()
        deadline = started + TIMEOUT
        while _daemonset(kube, created) is None:  # a GET every 10 ms: the figure's resolution
            assert time.monotonic() < deadline, "no DaemonSet for the new domain"
            time.sleep(0.01)
        latencies.append(time.monotonic() - started)
    median, worst = statistics.median(latencies), max(latencies)
    print(
        f"\n{DOMAINS} domains made in one burst: every DaemonSet after {informed['burst_s']:.2f} s; "
        f"a new domain's DaemonSet ({NEW} one after the other, {DOMAINS} present): median {median * 1000:.0f} ms, "
        f"max {worst * 1000:.0f} ms; controller RSS {_rss_mib(informed['controller']):.0f} MiB; the burst's writes "
        f"{informed['burst_writes']}"
    )
    # 1 s is the target; the slack is this shared 2-core machine's (other test runs, builds).
    assert median <= 1.0, latencies
    assert worst <= 2.5, latencies


def test_an_idle_controller_sends_no_list_or_get_over_several_rewatches(informed: dict[str, Any]) -> None:
    controller: ControllerRun = informed["controller"]

    def domain_requests() -> dict[tuple[str, str, str], float]:
        return {k: v for k, v in _counts(controller).items() if k[2] != "leases"}

    # Settled first: the burst's status writes and their echoes done (no request in 2 s).
    last: list[dict[tuple[str, str, str], float]] = [domain_requests()]

    def quiet() -> bool:
        now = domain_requests()
        same, last[0] = now == last[0], now
        return same

    informed["kube"].wait("the controller to be quiet", quiet, TIMEOUT)
    before, leases_before = domain_requests(), _counts(controller)
    time.sleep(IDLE_WINDOW)  # the measurement window, not a synchronisation
    after, leases_after = domain_requests(), _counts(controller)
    lease_requests = sum(v for k, v in leases_after.items() if k[2] == "leases") - sum(
        v for k, v in leases_before.items() if k[2] == "leases"
    )

    def without_watches(counts: dict[tuple[str, str, str], float]) -> dict[tuple[str, str, str], float]:
        return {k: v for k, v in counts.items() if k[1] != "WATCH"}

    def watches_of(counts: dict[tuple[str, str, str], float]) -> float:
        return sum(v for k, v in counts.items() if k[1] == "WATCH")

    watches = watches_of(after) - watches_of(before)
    print(
        f"\nidle over {IDLE_WINDOW:.0f} s with {DOMAINS} domains: requests other than the Lease and watches "
        f"{sum(without_watches(after).values()) - sum(without_watches(before).values()):.0f}; watches opened again "
        f"{watches:.0f} (--watch-timeout 5); Lease renewals {lease_requests * 60 / IDLE_WINDOW:.0f} requests/min"
    )
    # No list, get or write for the domains while nothing changes, though every watch ended and was opened
    # again (from its resourceVersion: no relist) at least once in the window.
    assert without_watches(after) == without_watches(before)
    assert watches >= INFORMERS, (before, after)


def test_a_restarted_controller_converges_what_changed_while_it_was_down(informed: dict[str, Any]) -> None:
    kube: Kube = informed["kube"]
    plane: ControlPlane = informed["plane"]
    informed["controller"].stop()  # a clean stop hands the Lease back
    gone = informed["domains"][:5]
    for domain in gone:
        kube.delete("daemonsets", api.daemon_object_name(domain["metadata"]["uid"]), NAMESPACE)
    later = _create(kube, "informer-while-down")
    started = time.monotonic()
    restarted = ControllerRun(
        informed["kubeconfig"], plane.logs / "cd-controller-informers-2.log", "informers", extra=WATCH_TIMEOUT
    )
    informed["controller"] = restarted
    for domain in [*gone, later]:
        kube.wait("the DaemonSets made again", lambda d=domain: _daemonset(kube, d), TIMEOUT)
    count = len(kube.list("computedomains", USER_NS, labelSelector=f"{LABEL}={VALUE}"))
    print(
        f"\nrestart with {count} domains: the missing DaemonSets back {time.monotonic() - started:.2f} s after the "
        "process started (its start-up and the Lease included)"
    )
