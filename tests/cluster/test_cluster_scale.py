"""The scale harness at a small size, in CI: the real control plane, kwok (scripts/build-kwok) and 50 fake Nodes
(40 DGX H100s, 10 GB200 trays) each with the slices our driver publishes; then one pod's claim explained by
`dradriver explain --pod` while a scheduling gate holds it, and placed by the real scheduler once released (one that
fits nowhere refused by both); explain's paged reads of the slices counted. The full size (5,000 nodes) is
benchmarks/bench_cluster_scale.py; docs/performance.md, "Cluster scale"."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster_fixtures import failures
from support.scale import (
    KWOK_ANNOTATION,
    NodeGroup,
    Probe,
    ScaleCluster,
    create_gated_probe,
    delete_probe,
    release_probe,
    release_unschedulable_probe,
    scale_cluster,
    time_explain,
)

from dradriver.cli.explain_cluster import KubernetesReader
from dradriver.plugin.cluster.transport import Transport

GROUPS = [NodeGroup(40), NodeGroup(10, "gb200-nvl72-tray", prefix="gb200")]
GPUS = 40 * 8 + 10 * 4


@pytest.fixture(scope="module")
def fleet() -> Iterator[ScaleCluster]:
    root = Path(tempfile.mkdtemp(prefix="dra-scale-", dir="/tmp"))
    failed_before = failures()
    with scale_cluster(root, GROUPS, workers=8) as cluster:
        yield cluster
    if failures() > failed_before:
        sys.stderr.write(f"\nscale tests failed: control-plane and kwok logs kept in {root / 'logs'}\n")
    else:
        shutil.rmtree(root, ignore_errors=True)


def test_kwok_keeps_every_node_ready_with_our_slices(fleet: ScaleCluster) -> None:
    nodes = list(fleet.pool.pages("/api/v1/nodes", labelSelector="type=kwok"))
    assert len(nodes) == 50
    for node in nodes:
        assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
        assert not node["spec"].get("taints"), node["metadata"]["name"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
    slices = list(fleet.pool.pages("/apis/resource.k8s.io/v1/resourceslices"))
    # One pool per node, named for it, owned by it; each GPU with its own UUID.
    assert sorted(s["spec"]["pool"]["name"] for s in slices) == sorted(n["metadata"]["name"] for n in nodes)
    assert all(s["spec"]["nodeName"] == s["spec"]["pool"]["name"] for s in slices)
    assert all(s["metadata"]["ownerReferences"][0]["name"] == s["spec"]["nodeName"] for s in slices)
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert len(devices) == fleet.fleet.devices == GPUS
    assert len({d["attributes"]["uuid"]["string"] for d in devices}) == GPUS
    assert {d["attributes"]["productName"]["string"] for d in devices} >= {"NVIDIA GB200"}


def test_explain_and_the_scheduler_place_the_same_pod(fleet: ScaleCluster) -> None:
    probe = Probe(count=8)  # a whole DGX: only the H100 nodes have eight GPUs
    create_gated_probe(fleet.pool, probe)
    explained = time_explain(fleet.plane, probe, runs=1)
    assert explained["exit"] == 0 and explained["fits"], explained
    assert explained["node"].startswith("h100-")
    placed = release_probe(fleet.plane, fleet.pool, probe)
    assert placed["node"].startswith("h100-") and placed["phase"] == "Running"
    # The scheduler's own histograms saw this pod's attempt and its SLI.
    assert placed["attempt"]["observations"] >= 1 and placed["attempt"]["seconds"] > 0
    assert placed["sli"]["observations"] >= 1
    claim = fleet.plane.kube.get("resourceclaims", probe.name, "scale")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {placed["node"]} and len(results) == 8


def test_a_pod_that_fits_nowhere_is_refused_by_explain_and_the_scheduler_alike(fleet: ScaleCluster) -> None:
    probe = Probe(name="too-big", count=9)  # nine GPUs: no node here has more than eight
    create_gated_probe(fleet.pool, probe)
    try:
        explained = time_explain(fleet.plane, probe, runs=1)
        assert explained["exit"] == 1 and explained["fits"] is False, explained
        refused = release_unschedulable_probe(fleet.plane, fleet.pool, probe)
        assert refused["node"] is None
        assert refused["condition"]["status"] == "False" and refused["condition"]["reason"] == "Unschedulable"
        # The scheduler's own histogram counted the failed attempt, with its time.
        assert refused["attempt"]["observations"] >= 1 and refused["attempt"]["seconds"] > 0
    finally:
        delete_probe(fleet.pool, probe)


def test_explain_reads_every_slice_page_by_page_from_the_real_api_server(
    fleet: ScaleCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seven a page: the 50 slices come in 8 pages, which only a reader following `continue` gets all of. Every
    # request the reader sends is counted on its way out.
    sent: list[tuple[str, str, dict[str, str]]] = []
    send = Transport.request

    def counted(transport: Transport, method: str, path: str, **options: Any) -> Any:
        sent.append((method, path, dict(options.get("query") or [])))
        return send(transport, method, path, **options)

    monkeypatch.setattr(Transport, "request", counted)
    reader = KubernetesReader(str(fleet.plane.kubeconfig), None, page_size=7)
    try:
        slices = reader.list_resource_slices()
    finally:
        reader.close()
    assert len(slices) == 50 and {s["kind"] for s in slices} == {"ResourceSlice"}
    assert len({s["metadata"]["name"] for s in slices}) == 50
    assert [(method, path) for method, path, _ in sent] == [("GET", "/apis/resource.k8s.io/v1/resourceslices")] * 8
    assert all(query["limit"] == "7" for _, _, query in sent)
    # The first page asks from the start; each later one continues where the one before ended.
    assert "continue" not in sent[0][2] and all(query.get("continue") for _, _, query in sent[1:])
