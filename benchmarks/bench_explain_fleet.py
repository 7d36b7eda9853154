"""Benchmark: where `dradriver explain --pod`'s time goes over a fleet, without a cluster.

    python benchmarks/bench_explain_fleet.py [--nodes 5000] [--mig-nodes 500] [--json benchmarks/explain-fleet.json]

The slices are those the scale harness creates (tests/support/scale.py: our publisher's slices for a DGX H100, one
pool per node, with its own names and UUIDs), served as the API server sends a paginated list: compact JSON pages
of 500 objects. Measured in this process, best and median of three:

* parse: every page through ``json.loads`` and the reader's wrapping of each item (explain_cluster.KubernetesReader),
  with Python's cyclic collector on (as explain read before) and paused (as it reads now);
* allocator: explain_outcome.explain_document for each probe over every node (cold: the first one of the process,
  which also builds CEL's parser; warm: again), and for the probe that fits nowhere the device placements the
  search tried on one dynamic-MIG node (all 255 subsets of its 8 GPUs before the early stop counted what the
  selectors had refused; 8 now).

What the API server and the network add, and the CLI's start-up, need the real cluster: bench_cluster_scale.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from support.scale import PAGE, node_slices, slice_template  # noqa: E402

from dradriver.allocator.search import AllocationInputs, Search  # noqa: E402
from dradriver.cli.explain_input import Document  # noqa: E402
from dradriver.cli.explain_outcome import explain_document  # noqa: E402

GPU, MIG = "gpu.dradriver.dev", "mig-1g.10gb.dradriver.dev"
PROBES = {"1 GPU": (GPU, 1), "8 GPUs": (GPU, 8), "9 GPUs (fits nowhere)": (GPU, 9), "1 x 1g.10gb": (MIG, 1),
          "7 x 1g.10gb": (MIG, 7)}  # fmt: skip


def fleet_pages(nodes: int, mig_nodes: int) -> list[bytes]:
    """The slices of ``nodes`` whole-GPU and ``mig_nodes`` dynamic-MIG DGX H100s as list pages of PAGE objects."""
    items: list[dict[str, Any]] = []
    for count, mode, prefix in ((nodes, "none", "h100"), (mig_nodes, "dynamic", "mig")):
        template = slice_template("hgx-h100-80gb", mode)
        for index in range(count):
            items += node_slices(template, f"{prefix}-{index:05d}", f"uid-{prefix}-{index}")
    return [
        json.dumps({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {},
                    "items": items[start:start + PAGE]}, separators=(",", ":")).encode()
        for start in range(0, len(items), PAGE)
    ]  # fmt: skip


def parse(pages: list[bytes]) -> list[dict[str, Any]]:
    """What the reader does with the pages: each parsed, each item given its apiVersion and kind."""
    slices: list[dict[str, Any]] = []
    for page in pages:
        slices += [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **item}
                   for item in json.loads(page)["items"]]  # fmt: skip
    return slices


def timed(work: Callable[[], object], *, collector: bool, runs: int = 3) -> dict[str, float]:
    """Best and median wall seconds of ``work`` over ``runs``, with the cyclic collector on or paused."""
    seconds = []
    for _ in range(runs):
        gc.collect()
        if not collector:
            gc.disable()
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
        gc.enable()
    return {"best_seconds": round(min(seconds), 3), "median_seconds": round(statistics.median(seconds), 3)}


def claim(device_class: str, count: int) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}
    spec = {"devices": {"requests": [request]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "probe", "namespace": "scale"}, "spec": spec}  # fmt: skip


def allocator_figures(slices: list[dict[str, Any]], classes: list[dict[str, Any]]) -> dict[str, Any]:
    """Each probe explained over the fleet, cold then warm, and its verdict."""
    figures = {}
    for name, (device_class, count) in PROBES.items():
        times, outcome = [], None
        for _ in range(2):
            started = time.perf_counter()
            outcome = explain_document(Document(claim(device_class, count), "probe"), slices=slices,
                                       classes=classes, allocated=[], node=None)  # fmt: skip
            times.append(round(time.perf_counter() - started, 3))
        assert outcome is not None
        figures[name] = {"cold_seconds": times[0], "warm_seconds": times[1], "fits": outcome.fits,
                         "node": outcome.node}  # fmt: skip
    return figures


def mig_node_attempts(classes: list[dict[str, Any]]) -> int:
    """Device placements the search tries for 9 GPUs on one dynamic-MIG DGX H100 (8 GPUs, 208 devices)."""
    slices = node_slices(slice_template("hgx-h100-80gb", "dynamic"), "mig-attempts", "uid")
    search = Search(AllocationInputs(claim(GPU, 9), slices=slices, classes=classes, node="mig-attempts"))
    assert not search.run()
    return search.attempts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="whole-GPU DGX H100 nodes")
    parser.add_argument("--mig-nodes", type=int, default=500, help="dynamic-MIG DGX H100 nodes")
    parser.add_argument("--json", type=Path, help="write the figures here as well")
    args = parser.parse_args()
    classes = [d for f in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml"))
               for d in yaml.safe_load_all(f.read_text()) if d]  # fmt: skip
    pages = fleet_pages(args.nodes, args.mig_nodes)
    results: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "benchmarks/bench_explain_fleet.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        "nodes": args.nodes, "mig_nodes": args.mig_nodes, "pages": len(pages),
        "json_bytes": sum(len(page) for page in pages),
        "parse_collector_on": timed(lambda: parse(pages), collector=True),
        "parse_collector_paused": timed(lambda: parse(pages), collector=False),
    }  # fmt: skip
    gc.disable()
    slices = parse(pages)
    gc.freeze()  # as explain keeps what it read out of the collector's scans
    gc.enable()
    results["allocator"] = allocator_figures(slices, classes)
    results["mig_node_misfit_attempts"] = mig_node_attempts(classes)
    results["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    text = json.dumps(results, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
