"""What our node-side components ask of the API server at rest, read from the API server's own audit log.

``apiserver_request_total`` counts requests by verb, resource and code but not by client, so the harness turns
on an audit log (every request at the Metadata level: who, which user agent, which verb on what) and counts the
events of each component: our user agent (``dradriver/<version> ...``) and the component's identity (the GPU
driver on the admin's kubeconfig, the ComputeDomain node plugin on the chart's plugin service account). A watch
is one request however long it stays open; watches are counted apart from the rest.

The budgets are docs/performance.md's ("Cluster scale", the node side); tests/cluster/test_node_request_budget.py
fails when a component exceeds its own."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.cd_cluster import NAMESPACE, PLUGIN_ACCOUNT, account_kubeconfig, install_chart_parts
from support.cluster_node import DriverRun
from support.control_plane import ControlPlane, NodeKeeper, binaries_dir
from support.scale import apply_device_classes

# Every request once, at the Metadata level (no bodies): the events of a finished request and of a watch's start.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""
USER_AGENT_PREFIX = "dradriver/"


@dataclass(frozen=True)
class Budget:
    """At most ``requests`` requests a minute per node at rest apart from watches, and ``watches`` watches opened."""

    requests: float
    watches: float


# docs/performance.md's table, "Cluster scale": the node side at rest. Both measured 1 request a minute (the
# Node's GET of the once-a-minute rescan) and no watch opened beyond start-up's; a minute's window can catch two of a
# once-a-minute request, so 2 is the budget, and a new poll every 30 s or faster exceeds it.
BUDGETS = {
    "gpu-driver": Budget(requests=2.0, watches=2.0),
    "gpu-and-compute-domain-driver": Budget(requests=2.0, watches=2.0),
}


def audit_args(root: Path) -> tuple[str, ...]:
    """The kube-apiserver flags of an audit log of every request under ``root`` (ControlPlane.apiserver_args)."""
    policy = root / "audit-policy.yaml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY)
    return (f"--audit-policy-file={policy}", f"--audit-log-path={root / 'logs' / 'audit.log'}",
            "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s")  # fmt: skip


def audit_events(plane: ControlPlane) -> list[dict[str, Any]]:
    """Every audit event written so far, one per request (a watch's start and end are one request)."""
    log = plane.logs / "audit.log"
    seen: dict[str, dict[str, Any]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        event = json.loads(line)
        seen.setdefault(event["auditID"], event)
    return list(seen.values())


def _received(event: dict[str, Any]) -> float:
    stamp = str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


@dataclass
class Tally:
    """One component's requests in a window: per minute, and what they were."""

    component: str
    seconds: float
    requests: int = 0
    watches: int = 0
    what: Counter[str] = field(default_factory=Counter)

    @property
    def requests_per_minute(self) -> float:
        return self.requests * 60.0 / self.seconds

    @property
    def watches_per_minute(self) -> float:
        return self.watches * 60.0 / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {"component": self.component, "seconds": round(self.seconds, 1), "requests": self.requests,
                "watches": self.watches, "requests_per_minute": round(self.requests_per_minute, 2),
                "watches_per_minute": round(self.watches_per_minute, 2), "what": dict(self.what)}  # fmt: skip


def tally(plane: ControlPlane, components: dict[str, str], start: float, end: float) -> dict[str, Tally]:
    """Per component (name -> the username it authenticates as), its requests received between ``start`` and
    ``end`` (epoch seconds) with our user agent."""
    tallies = {name: Tally(name, end - start) for name in components}
    by_user = {user: name for name, user in components.items()}
    for event in audit_events(plane):
        name = by_user.get(str((event.get("user") or {}).get("username")))
        if name is None or not str(event.get("userAgent", "")).startswith(USER_AGENT_PREFIX):
            continue
        if not start <= _received(event) < end:
            continue
        ref = event.get("objectRef") or {}
        what = f"{event['verb']} {ref.get('resource', event.get('requestURI', ''))}"
        if ref.get("subresource"):
            what += f"/{ref['subresource']}"
        tallies[name].what[what] += 1
        if event["verb"] == "watch":
            tallies[name].watches += 1
        else:
            tallies[name].requests += 1
    return tallies


def wait_quiet(plane: ControlPlane, components: dict[str, str], quiet: float = 5.0, timeout: float = 120.0) -> None:
    """Until none of ``components`` has made a request (other than a watch) for ``quiet`` seconds: start-up done."""
    users = set(components.values())
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        last = max((_received(e) for e in audit_events(plane) if str((e.get("user") or {}).get("username")) in users
                    and e["verb"] != "watch"), default=0.0)  # fmt: skip
        if time.time() - last >= quiet:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the components still made requests after {timeout:.0f}s")
        pause.wait(0.5)


def flushed(plane: ControlPlane, after: float, timeout: float = 30.0) -> None:
    """Until the audit log holds a request received after ``after`` (a marker of ours): every request before it
    has been written (the batch backend writes in order)."""
    plane.kube.get("namespaces", "default")
    plane.kube.wait("the audit log to catch up", lambda: any(_received(e) >= after for e in audit_events(plane)),
                    timeout)  # fmt: skip


def measure_rest(plane: ControlPlane, components: dict[str, str], seconds: float) -> dict[str, Tally]:
    """Once start-up is over, each component's requests over ``seconds`` of rest (the measurement is the wait)."""
    wait_quiet(plane, components)
    start = time.time()
    threading.Event().wait(seconds)
    end = time.time()
    flushed(plane, end)
    return tally(plane, components, start, end)


# The defaults a deployment runs with, where DriverRun's test settings differ (it turns rescans off).
DEFAULT_INTERVALS = ("--rescan-interval", "60")


@contextmanager
def resting_components(root: Path) -> Iterator[tuple[ControlPlane, dict[str, str]]]:
    """A control plane with the audit log and both node-side components serving their Nodes with their default
    intervals: `dradriver run` (simulated DGX H100, dynamic MIG) on the admin's kubeconfig, and `dradriver run
    --compute-domains true` (a simulated GB200 tray) on the chart's plugin account bound to a pod on its node.
    Yields the plane and the components (name -> username), for :func:`measure_rest`; logs under ``root/logs``."""
    plane = ControlPlane(binaries_dir(), root, apiserver_args=audit_args(root))
    keepers: list[NodeKeeper] = []
    drivers: list[DriverRun] = []
    try:
        plane.start()
        apply_device_classes(plane)
        install_chart_parts(plane)
        keepers.append(NodeKeeper(plane.kube, "budget-gpu"))
        drivers.append(DriverRun(root / "gpu", "budget-gpu", plane.kubeconfig, profile="hgx-h100-80gb",
                                 mig_mode="dynamic", version="", extra=DEFAULT_INTERVALS))  # fmt: skip
        keepers.append(NodeKeeper(plane.kube, "budget-cd"))
        plugin = account_kubeconfig(plane, PLUGIN_ACCOUNT, root / "plugin.kubeconfig", _plugin_pod(plane, "budget-cd"))
        extra = (*DEFAULT_INTERVALS, "--compute-domains", "true", "--cd-namespace", NAMESPACE)
        drivers.append(DriverRun(root / "cd", "budget-cd", plugin, profile="gb200-nvl72-tray", mig_mode="none",
                                 version="", extra=extra))  # fmt: skip
        yield (
            plane,
            {
                "gpu-driver": "admin",
                "gpu-and-compute-domain-driver": f"system:serviceaccount:{NAMESPACE}:{PLUGIN_ACCOUNT}",
            },
        )
    finally:
        for index, driver in enumerate(drivers):
            driver.stop()
            (plane.logs / f"dradriver-{index}.log").write_text(driver.log)
        for keeper in keepers:
            keeper.stop()
        plane.stop()


def _plugin_pod(plane: ControlPlane, node: str) -> dict[str, Any]:
    """A pod on ``node`` for the plugin account's token to be bound to (the token then names the node)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"plugin-on-{node}", "namespace": NAMESPACE},
           "spec": {"nodeName": node, "serviceAccountName": PLUGIN_ACCOUNT, "automountServiceAccountToken": False,
                    "containers": [{"name": "plugin", "image": "dradriver"}]}}  # fmt: skip
    return plane.kube.create("pods", pod, NAMESPACE)
