"""Benchmark: the cluster at fleet size, on the real control plane with kwok's fake Nodes (tests/support/scale.py).

    python benchmarks/bench_cluster_scale.py [--nodes 5000] [--mig-nodes 500] [--only whole,mig,rest]
                                             [--rest-seconds 300] [--json benchmarks/cluster-scale.json]

Each variant starts a fresh harness: the control plane the cluster tests run (scripts/build-control-plane), kwok
(scripts/build-kwok) and the fleet, every Node with the ResourceSlices our driver publishes for it (one pool per
node), created by parallel requests over one connection pool:

* whole: ``--nodes`` DGX H100 nodes (simulated hgx-h100-80gb, 8 whole GPUs each: 40,000 GPUs at 5,000 nodes);
* mig: ``--mig-nodes`` of them with dynamic MIG (208 devices a node: every GPU and every MIG placement).

Then, for each probe pod (one claim, held Pending by a scheduling gate): `dradriver explain --pod` as a user runs
it (a new process, over the admin kubeconfig; three runs, their best and median), then the gate lifted and the real
scheduler's own time for the pod read from its metrics (scheduler_scheduling_attempt_duration_seconds and
scheduler_pod_scheduling_sli_duration_seconds, before and after). A probe that fits nowhere is explained too, and the
scheduler's unschedulable attempt timed.

* rest: the node side, requests a minute per node at rest over ``--rest-seconds`` (tests/support/request_budget.py:
  the API server's audit log, by component) against docs/performance.md's budgets; the test
  tests/cluster/test_node_request_budget.py measures a minute of it in CI.

Prints a table on stderr and the figures as JSON on stdout (or --json).
Explain's target: an answer in at most 2 s over the 5,000-node set; the benchmark exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from support.request_budget import BUDGETS, measure_rest, resting_components  # noqa: E402
from support.scale import (  # noqa: E402
    NAMESPACE,
    NodeGroup,
    Probe,
    ScaleCluster,
    create_gated_probe,
    release_probe,
    scale_cluster,
    scheduler_seconds,
    scheduler_snapshot,
    time_explain,
)

TARGET_SECONDS = 2.0


def rss_mib(cluster: ScaleCluster) -> dict[str, float]:
    """Each control-plane process's and kwok's resident memory now."""
    found = {}
    for component in cluster.plane.components:
        if component.proc is None:
            continue
        for line in Path(f"/proc/{component.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                found[component.name] = round(int(line.split()[1]) / 1024, 1)
    return found


def placed(cluster: ScaleCluster, probe: Probe) -> dict[str, Any]:
    """Explain, then the scheduler, on one gated probe pod that fits."""
    create_gated_probe(cluster.pool, probe)
    explained = time_explain(cluster.plane, probe)
    scheduled = release_probe(cluster.plane, cluster.pool, probe)
    return {"probe": vars(probe), "explain": explained, "scheduler": scheduled}


def unplaceable(cluster: ScaleCluster, probe: Probe, timeout: float = 300.0) -> dict[str, Any]:
    """Explain on a probe that fits nowhere (every device diagnosed), then the scheduler's unschedulable attempt."""
    create_gated_probe(cluster.pool, probe)
    explained = time_explain(cluster.plane, probe)
    before = scheduler_snapshot(cluster.plane, result="unschedulable")
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{probe.name}"
    cluster.pool.request("PATCH", path, b'{"spec":{"schedulingGates":null}}')
    cluster.plane.kube.wait("the scheduler's unschedulable attempt",
                            lambda: scheduler_snapshot(cluster.plane, result="unschedulable")["attempt"][1] >
                            before["attempt"][1], timeout)  # fmt: skip
    after = scheduler_snapshot(cluster.plane, result="unschedulable")
    return {"probe": vars(probe), "explain": explained, "scheduler": scheduler_seconds(before, after)}


def run_variant(
    name: str, groups: list[NodeGroup], probes: list[Probe], misfit: Probe | None, workers: int
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"dra-scale-{name}-", dir="/tmp"))
    try:
        with scale_cluster(root, groups, workers=workers) as cluster:
            fleet = cluster.fleet
            figures: dict[str, Any] = {
                "nodes": len(fleet.nodes), "slices": fleet.slices, "devices": fleet.devices,
                "create_seconds": round(fleet.create_seconds, 1), "ready_seconds": round(fleet.ready_seconds, 1),
                "nodes_per_second": round(len(fleet.nodes) / fleet.create_seconds, 1),
                "rss_mib_after_create": rss_mib(cluster),
            }  # fmt: skip
            figures["placed"] = [placed(cluster, probe) for probe in probes]
            if misfit is not None:
                figures["unplaceable"] = unplaceable(cluster, misfit)
            figures["rss_mib_end"] = rss_mib(cluster)
            return figures
    except BaseException:
        sys.stderr.write(f"variant {name} failed: logs kept in {root / 'logs'}\n")
        raise
    finally:
        if sys.exc_info()[0] is None:
            shutil.rmtree(root, ignore_errors=True)


def rest_figures(seconds: float) -> dict[str, Any]:
    """The node side at rest: each component's requests a minute against its budget."""
    root = Path(tempfile.mkdtemp(prefix="dra-scale-rest-", dir="/tmp"))
    with resting_components(root) as (plane, components):
        tallies = measure_rest(plane, components, seconds)
    shutil.rmtree(root, ignore_errors=True)
    return {name: {**tally.as_dict(), "budget": vars(BUDGETS[name])} for name, tally in tallies.items()}


def table(results: dict[str, Any]) -> list[str]:
    rows = ["| variant | nodes | devices | create | probe | explain (best of 3) | scheduler attempt | scheduler SLI |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, figures in results["variants"].items():
        if name == "rest":
            continue
        for entry in [*figures["placed"], *([figures["unplaceable"]] if "unplaceable" in figures else [])]:
            probe, explained, scheduled = entry["probe"], entry["explain"], entry["scheduler"]
            rows.append(
                f"| {name} | {figures['nodes']:,} | {figures['devices']:,} | {figures['create_seconds']} s | "
                f"{probe['count']} x {probe['device_class']} ({'fits' if explained['fits'] else 'fits nowhere'}) | "
                f"{explained['best_seconds']:.2f} s, median {explained['median_seconds']:.2f} s (start-up "
                f"{explained['start_up_seconds']:.2f} s; reading the slices "
                f"{explained['in_process']['read_slices_seconds']:.2f} s, allocator cold "
                f"{explained['in_process']['allocator_first_seconds']:.2f} s, warm "
                f"{explained['in_process']['allocator_seconds']:.2f} s) | "
                f"{scheduled['attempt']['seconds']:.3f} s | "
                f"{scheduled['sli']['seconds']:.3f} s |"
            )
    for name, tally in results["variants"].get("rest", {}).items():
        rows.append(
            f"| rest: {name} | 1 | - | - | {tally['seconds']} s at rest | {tally['requests_per_minute']} "
            f"requests/min, {tally['watches_per_minute']} watches/min (budget {tally['budget']}) | | |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="DGX H100 nodes of the whole-GPU variant")
    parser.add_argument("--mig-nodes", type=int, default=500, help="nodes of the dynamic-MIG variant")
    parser.add_argument("--only", default="whole,mig", help="variants to run, comma-separated")
    parser.add_argument("--workers", type=int, default=16, help="parallel requests while creating the fleet")
    parser.add_argument("--rest-seconds", type=float, default=300.0, help="how long the node side rests")
    parser.add_argument("--json", type=Path, help="write the figures here as well")
    args = parser.parse_args()
    variants = {
        "whole": ([NodeGroup(args.nodes)], [Probe(count=1), Probe("whole-node", count=8)], Probe("misfit", count=9)),
        "mig": ([NodeGroup(args.mig_nodes, mig_mode="dynamic", prefix="mig")],
                [Probe(device_class="mig-1g.10gb.dradriver.dev"), Probe("seven", "mig-1g.10gb.dradriver.dev", 7)],
                None),
    }  # fmt: skip
    started = time.time()
    results: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "benchmarks/bench_cluster_scale.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        "target_explain_seconds": TARGET_SECONDS,
        "variants": {},
    }
    for name in args.only.split(","):
        if name == "rest":
            results["variants"]["rest"] = rest_figures(args.rest_seconds)
            continue
        groups, probes, misfit = variants[name]
        results["variants"][name] = run_variant(name, groups, probes, misfit, args.workers)
    results["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    results["wall_seconds"] = round(time.time() - started, 1)
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    sys.stderr.write("\n".join(table(results)) + "\n")
    best = [e["explain"]["best_seconds"] for v in results["variants"].values() for e in v.get("placed", [])]
    over = [
        n
        for n, t in results["variants"].get("rest", {}).items()
        if t["requests_per_minute"] > t["budget"]["requests"] or t["watches_per_minute"] > t["budget"]["watches"]
    ]
    return 0 if all(seconds <= TARGET_SECONDS for seconds in best) and not over else 1


if __name__ == "__main__":
    sys.exit(main())
