"""Benchmark: pod start on the real node, a pod with one GPU claim against the same pod without claims.

    python benchmarks/bench_node_pod_start.py [--pods 15] [--json benchmarks/node-pod-start.json]

Starts the real control plane (scripts/build-control-plane) and the real node (scripts/build-node: kubelet and
containerd, `dradriver run` on a simulated mixed node), as the `node` tests do (docs/node-tests.md). Then, one
pod at a time, alternating the two kinds: create the pod (with a ResourceClaimTemplate for the claimed kind, so
each pod also waits for its claim to be generated, allocated and prepared), wait until the API server shows it
Running with its container ready, delete it and wait until it is gone. Pod start = creation timestamp to the
Ready condition's transition, both server-side (whole seconds in the API), so it is also measured client-side:
create call to first sight of Ready, polled every 50 ms. Prints the medians and the kubelet's own metrics of
our gRPC calls (`dra_grpc_operations_duration_seconds`, scraped from the kubelet's /metrics). The goal: the claim
adds at most 20% to pod start.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from support import real_node  # noqa: E402
from support.cluster_pods import kubectl  # noqa: E402
from support.control_plane import ControlPlane, binaries_dir, missing_binaries  # noqa: E402
from support.node_pods import Workloads, pin_to, running  # noqa: E402

NAMESPACE = "default"
GOAL = 1.20  # a claimed pod starts within 120% of an unclaimed one


def template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}}
        },
    }


def pod(name: str, claim_template: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "busybox:1.36", "command": ["sleep", "3600"]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [container]}
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def start_one(workloads: Workloads, name: str, claim_template: str | None) -> float:
    """Seconds from the create call to the pod's Ready, seen by polling; the pod is deleted again."""
    kube = workloads.kube
    doc = pin_to(pod(name, claim_template), workloads.node.name)
    began = time.monotonic()
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", doc)
    real_node.wait_for(
        f"pod {name} to run", lambda: running(kube.get("pods", name, NAMESPACE)), timeout=120, interval=0.05
    )
    took = time.monotonic() - began
    kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    real_node.wait_for(f"pod {name} to go", lambda: kube.find("pods", name, NAMESPACE) is None, timeout=120)
    return took


def kubelet_metrics(node: real_node.RealNode) -> dict[str, dict[str, float]]:
    """The kubelet's histogram of DRA gRPC calls: method -> {count, sum_seconds, mean_ms}."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
    url = f"https://127.0.0.1:{node.kubelet.port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        text = response.read().decode()
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("dra_grpc_operations_duration_seconds_"):
            continue
        name, value = line.rsplit(" ", 1)
        method = name.split('method_name="', 1)[1].split('"', 1)[0] if "method_name=" in name else "?"
        entry = found.setdefault(method, {})
        if name.startswith("dra_grpc_operations_duration_seconds_count"):
            entry["count"] = entry.get("count", 0.0) + float(value)
        elif name.startswith("dra_grpc_operations_duration_seconds_sum"):
            entry["sum_seconds"] = entry.get("sum_seconds", 0.0) + float(value)
    for entry in found.values():
        if entry.get("count"):
            entry["mean_ms"] = round(1000 * entry.get("sum_seconds", 0.0) / entry["count"], 2)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pods", type=int, default=15, help="pods of each kind (default 15)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the node's directory (its logs) afterwards")
    args = parser.parse_args()
    directory, node_dir = binaries_dir(), real_node.binaries_dir()
    gone = missing_binaries(directory) + real_node.missing(node_dir)
    if gone:
        sys.exit(f"missing: {', '.join(gone)}; run scripts/build-control-plane and scripts/build-node")
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    plane = ControlPlane(directory, root / "cp")
    node: real_node.RealNode | None = None
    try:
        plane.start()
        plane.kube.request(
            "POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", template("one-gpu")
        )
        subprocess.run(
            [kubectl(), "--kubeconfig", str(plane.kubeconfig), "apply", "--server-side", "-f",
             str(ROOT / "manifests" / "deviceclasses")],
            check=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        node = real_node.RealNode(node_dir, root / "node", plane)
        node.start()
        workloads = Workloads(node)
        start_one(workloads, "warm-up", "one-gpu")  # first pulls nothing but warms caches and connections
        plain: list[float] = []
        claimed: list[float] = []
        for number in range(args.pods):
            plain.append(start_one(workloads, f"plain-{number}", None))
            claimed.append(start_one(workloads, f"claimed-{number}", "one-gpu"))
        metrics = kubelet_metrics(node)
    finally:
        if node is not None:
            node.stop()
        plane.stop()
        if args.keep:
            print(f"logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    plain_ms, claimed_ms = statistics.median(plain) * 1000, statistics.median(claimed) * 1000
    ratio = claimed_ms / plain_ms
    figures = {
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "pods_each": args.pods,
        "pod_start_median_ms": {"without_claim": round(plain_ms, 1), "with_one_gpu_claim": round(claimed_ms, 1)},
        "pod_start_p90_ms": {
            "without_claim": round(statistics.quantiles(plain, n=10)[-1] * 1000, 1),
            "with_one_gpu_claim": round(statistics.quantiles(claimed, n=10)[-1] * 1000, 1),
        },
        "claim_overhead_ratio": round(ratio, 3),
        "goal_ratio": GOAL,
        "met": ratio <= GOAL,
        "kubelet_dra_grpc": metrics,
    }
    print(f"| pod start, median of {args.pods} | without claim | with one GPU claim | ratio (goal <= {GOAL}) |")
    print("|---|---|---|---|")
    verdict = "met" if figures["met"] else "MISSED"
    print(f"| create to Ready | {plain_ms:.0f} ms | {claimed_ms:.0f} ms | {ratio:.2f}: {verdict} |")
    for method, entry in sorted(metrics.items()):
        print(f"kubelet: {method}: {int(entry.get('count', 0))} calls, mean {entry.get('mean_ms', 0)} ms")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
