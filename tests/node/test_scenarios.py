"""Every example scenario that fits the simulated node, run by the real kubelet and containerd: its pods reach
Running, their containers report the devices the driver's CDI spec gave them, and deleting them makes the kubelet
unprepare (the claim's CDI spec goes, status.devices is cleared, MIG partitions are destroyed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support.kube_rest import Kube
from support.node_pods import (
    Workloads,
    cdi_specs_of,
    claims_of,
    documents,
    pod_spec_of,
    status_devices,
)
from support.real_node import RealNode, wait_for

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "examples" / "scenarios").glob("*.yaml"))


def header(path: Path, field: str) -> str | None:
    match = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    return match.group(1).strip() if match else None


def fits(path: Path, node: RealNode) -> str | None:
    """Why the scenario cannot run on ``node`` (None: it can)."""
    needs = header(path, "Needs")
    if needs:
        return f"needs {needs}"
    wanted = header(path, "Node") or ""
    if wanted != f"{node.profile} --mig-mode {node.mig_mode}":
        return f"written for a node {wanted!r}; this one is {node.profile} --mig-mode {node.mig_mode}"
    return None


def workload_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if pod_spec_of(d) is not None]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_runs_on_the_real_kubelet_and_unprepares_on_delete(
    path: Path, node: RealNode, workloads: Workloads, kube: Kube
) -> None:
    reason = fits(path, node)
    if reason:
        pytest.skip(reason)
    expect = re.compile(header(path, "Expect") or "^DRADRIVER_DEVICE_")
    docs = documents(path)
    workloads.apply(docs)
    claims: list[dict[str, Any]] = []
    try:
        for doc in workload_docs(docs):
            for pod in workloads.wait_running(doc):
                spec = pod_spec_of(doc)
                assert spec is not None
                logs = workloads.logs(pod)
                reports = [line for line in logs.splitlines() if "DRADRIVER_DEVICE_" in line]
                assert len(reports) >= len(spec["containers"]), logs  # at least one report per container
                for line in reports:
                    assert expect.search(line.split(" ", 1)[1]), f"{line!r} does not match {expect.pattern!r}"
                for claim in claims_of(kube, pod):
                    uid = claim["metadata"]["uid"]
                    assert cdi_specs_of(node, uid), f"no CDI spec for claim {claim['metadata']['name']}"
                    assert status_devices(kube, claim), f"claim {claim['metadata']['name']} has no status.devices"
                    claims.append(claim)
    finally:
        workloads.delete(reversed(docs))
    for claim in claims:
        uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
        wait_for(f"the CDI spec of claim {name} to go", lambda uid=uid: not cdi_specs_of(node, uid), 90)
        assert status_devices(kube, claim) == [], f"claim {name} kept status.devices after unprepare"
