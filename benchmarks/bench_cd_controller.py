"""Benchmark: the ComputeDomain controller on informers at fleet size, in the scale harness (tests/support/scale.py).

    python benchmarks/bench_cd_controller.py [--domains 1000] [--nodes 300] [--idle-seconds 60]
                                             [--json benchmarks/cd-controller.json]

The real control plane with kwok's fake Nodes (``--nodes`` DGX H100 nodes with their slices), the chart's CRDs and
RBAC, and ``dradriver cd-controller`` as a process on the chart's service account. Then:

* burst: ``--domains`` ComputeDomains created at once (16 parallel requests), timed until every DaemonSet exists;
* nodes: one domain label on each node (as the node plugin labels a node at a channel prepare), so the DaemonSet
  controller makes a daemon pod on each: pods the controller's cache holds (Pending here: kwok nodes publish no
  ComputeDomain devices, so no daemon runs and no clique forms);
* idle: the controller's own request counters (dradriver_computedomain_api_reads/writes_total) and its CPU time
  over ``--idle-seconds`` once it is quiet;
* new domains: 10, one after the other, each timed to its DaemonSet (a GET every 10 ms);
* restart: a clean stop, 10 DaemonSets deleted meanwhile, a new process: timed until they are back and until the
  controller is quiet again (every domain reconciled);
* memory: the controller's RSS with no domains, and after.

Prints a table on stderr and the figures as JSON on stdout (or --json). Targets (issue #37): idle at most 10
requests a minute apart from watches, a new domain's objects in at most 1 s; the benchmark exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from support.cd_cluster import (  # noqa: E402
    CONTROLLER_ACCOUNT,
    NAMESPACE,
    ControllerRun,
    account_kubeconfig,
    install_chart_parts,
)
from support.scale import NodeGroup, Pool, scale_cluster  # noqa: E402

from dradriver.computedomain import api  # noqa: E402

USER_NS = "default"
LEASE = "dradriver-compute-domain-controller"
IDENTITY = "bench"
NEW = 10
RESTART_DELETED = 10
IDLE_TARGET_PER_MIN = 10.0
LATENCY_TARGET_S = 1.0


def counts(controller: ControllerRun) -> dict[str, float]:
    """The controller's requests so far: "reads VERB resource" / "writes VERB resource" → count."""
    code, text = controller.get("/metrics")
    assert code == 200, text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("dradriver_computedomain_api_reads", "dradriver_computedomain_api_writes"):
            kind = family.name.rsplit("_", 1)[-1]
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[f"{kind} {sample.labels['verb']} {sample.labels['resource']}"] = sample.value
    return found


def cpu_seconds(controller: ControllerRun) -> float:
    fields = Path(f"/proc/{controller.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mib(controller: ControllerRun) -> float:
    for line in Path(f"/proc/{controller.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def wait(what: str, probe: Any, timeout: float = 900.0, pause: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(pause)


def quiet(controller: ControllerRun, seconds: float = 3.0, timeout: float = 900.0) -> float:
    """Wait until no request but the Lease's for ``seconds``; how long that took (the quiet time excluded)."""
    started = time.monotonic()
    last, since = None, time.monotonic()
    while True:
        now = {k: v for k, v in counts(controller).items() if not k.endswith(" leases")}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return since - started
        if time.monotonic() - started > timeout:
            raise TimeoutError("the controller never went quiet")
        time.sleep(0.25)


def domain(name: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": name},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
        }
    ).encode()


def daemonsets(pool: Pool) -> set[str]:
    return {d["metadata"]["name"] for d in pool.pages(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")}


def start_controller(plane: Any, kubeconfig: Path, log: str) -> ControllerRun:
    controller = ControllerRun(kubeconfig, plane.logs / log, IDENTITY)
    wait(
        "the controller to lead",
        lambda: (plane.kube.find("leases", LEASE, NAMESPACE) or {}).get("spec", {}).get("holderIdentity") == IDENTITY,
    )
    wait("the controller's metrics", lambda: counts(controller) is not None)
    return controller


def burst(pool: Pool, count: int) -> tuple[list[dict[str, Any]], float]:
    started = time.monotonic()
    made: list[dict[str, Any]] = []
    pool.each(
        lambda i: made.append(
            pool.request("POST", f"/apis/{api.API_VERSION}/namespaces/{USER_NS}/computedomains", domain(f"cd-{i:05d}"))
        ),
        range(count),
    )
    wanted = {api.daemon_object_name(d["metadata"]["uid"]) for d in made}
    wait("every DaemonSet", lambda: wanted <= daemonsets(pool), pause=0.5)
    return made, time.monotonic() - started


def label_nodes(pool: Pool, nodes: list[str], made: list[dict[str, Any]]) -> float:
    started = time.monotonic()
    pairs = list(zip(nodes, made, strict=False))
    pool.each(
        lambda pair: pool.request(
            "PATCH",
            f"/api/v1/nodes/{pair[0]}",
            json.dumps({"metadata": {"labels": {api.DOMAIN_LABEL: pair[1]["metadata"]["uid"]}}}).encode(),
        ),
        pairs,
    )
    selector = api.DOMAIN_LABEL
    wait(
        "a daemon pod on every labelled node",
        lambda: (
            sum(1 for _ in pool.pages(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=selector)) >= len(pairs)
        ),
        pause=0.5,
    )
    return time.monotonic() - started


def idle(controller: ControllerRun, seconds: float) -> dict[str, Any]:
    quiet(controller)
    before, cpu = counts(controller), cpu_seconds(controller)
    time.sleep(seconds)  # the window measured
    after, cpu = counts(controller), cpu_seconds(controller) - cpu
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    other = sum(v for k, v in delta.items() if not k.endswith(" leases") and " WATCH " not in k)
    return {
        "seconds": seconds,
        "requests": delta,
        "per_minute_apart_from_watches_and_lease": other * 60 / seconds,
        "per_minute_lease": sum(v for k, v in delta.items() if k.endswith(" leases")) * 60 / seconds,
        "cpu_percent": round(100 * cpu / seconds, 2),
    }


def new_domains(pool: Pool, plane: Any) -> list[float]:
    latencies = []
    for i in range(NEW):
        made = pool.request(
            "POST", f"/apis/{api.API_VERSION}/namespaces/{USER_NS}/computedomains", domain(f"cd-new-{i}")
        )
        started = time.monotonic()
        name = api.daemon_object_name(made["metadata"]["uid"])
        wait("the new DaemonSet", lambda n=name: plane.kube.find("daemonsets", n, NAMESPACE), 60, pause=0.01)
        latencies.append(round(time.monotonic() - started, 3))
    return latencies


def restart(controller: ControllerRun, plane: Any, pool: Pool, kubeconfig: Path, made: list[dict[str, Any]]) -> Any:
    controller.stop()
    names = [api.daemon_object_name(d["metadata"]["uid"]) for d in made[:RESTART_DELETED]]
    for name in names:
        pool.request("DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{name}")
    started = time.monotonic()
    restarted = start_controller(plane, kubeconfig, "cd-controller-restarted.log")
    wait("the deleted DaemonSets back", lambda: set(names) <= daemonsets(pool), pause=0.2)
    back = time.monotonic() - started
    converged = back + quiet(restarted)  # until its last request before the quiet
    return restarted, {"deleted_back_s": round(back, 2), "quiet_s": round(converged, 2)}


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    with scale_cluster(root, [NodeGroup(args.nodes)]) as cluster:
        plane, pool = cluster.plane, cluster.pool
        install_chart_parts(plane)
        kubeconfig = account_kubeconfig(plane, CONTROLLER_ACCOUNT, plane.root / "cd-controller.kubeconfig")
        controller = start_controller(plane, kubeconfig, "cd-controller.log")
        figures: dict[str, Any] = {"domains": args.domains, "nodes": args.nodes, "rss_mib_empty": rss_mib(controller)}
        try:
            made, figures["burst_s"] = burst(pool, args.domains)
            figures["burst_writes"] = {k: v for k, v in counts(controller).items() if k.startswith("writes")}
            figures["label_nodes_s"] = label_nodes(pool, cluster.fleet.nodes, made)
            figures["idle"] = idle(controller, args.idle_seconds)
            figures["new_domain_s"] = new_domains(pool, plane)
            figures["rss_mib"] = rss_mib(controller)
            controller, figures["restart"] = restart(controller, plane, pool, kubeconfig, made)
            figures["rss_mib_after_restart"] = rss_mib(controller)
        finally:
            controller.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cd-controller-"))
    figures = run(args, root)
    latencies = figures["new_domain_s"]
    idle_rate = figures["idle"]["per_minute_apart_from_watches_and_lease"]
    misses = [
        what
        for what, missed in (
            ("idle requests", idle_rate > IDLE_TARGET_PER_MIN),
            ("new domain latency", statistics.median(latencies) > LATENCY_TARGET_S),
        )
        if missed
    ]
    median, worst = statistics.median(latencies) * 1000, max(latencies) * 1000
    restarted, rss = (
        figures["restart"],
        (figures["rss_mib_empty"], figures["rss_mib"], figures["rss_mib_after_restart"]),
    )
    rows = [
        ("domains / nodes", f"{args.domains} / {args.nodes}"),
        ("burst to every DaemonSet", f"{figures['burst_s']:.1f} s"),
        ("labelled nodes to their daemon pods", f"{figures['label_nodes_s']:.1f} s"),
        ("idle requests/min apart from watches and the Lease", f"{idle_rate:.1f}"),
        ("idle Lease requests/min", f"{figures['idle']['per_minute_lease']:.0f}"),
        ("idle CPU", f"{figures['idle']['cpu_percent']} %"),
        ("new domain to DaemonSet", f"median {median:.0f} ms, max {worst:.0f} ms"),
        ("restart: deleted DaemonSets back / quiet", f"{restarted['deleted_back_s']} s / {restarted['quiet_s']} s"),
        ("RSS empty / loaded / after restart", " / ".join(str(r) for r in rss) + " MiB"),
    ]
    for label, value in rows:
        print(f"{label:55} {value}", file=sys.stderr)
    text = json.dumps(figures, indent=2, sort_keys=True)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    if misses:
        print(f"missed: {', '.join(misses)}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
