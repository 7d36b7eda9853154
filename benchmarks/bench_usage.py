"""The cost of the usage metrics on an 8-GPU node split into 56 MIG devices (64 devices, one process each).

    python benchmarks/bench_usage.py            # medians as JSON on stdout; exit status 1 over budget

A sample (what the sampler thread does every --usage-interval: six NVML reads per device, processes mapped to
pods) and a scrape of the usage series (what Prometheus waits for). The budget is a 50 ms scrape; the simulated
NVML answers faster than a real one, but NVML is only ever called by the sampler, never in a scrape."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from dradriver.driver.observe.usage import UsageCollector, UsageSampler  # noqa: E402
from dradriver.sim.fakelib import simulated_gpulib_on  # noqa: E402
from tests.driver.observe.test_usage import node_of_56_mig_devices  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed samples and scrapes (the figure is the median)")
    args = parser.parse_args()
    node, devices = node_of_56_mig_devices()
    sampler = UsageSampler(simulated_gpulib_on(node), lambda: devices, list)
    samples = [sampler.sample().duration_seconds for _ in range(args.runs)]
    registry = CollectorRegistry()
    registry.register(UsageCollector(sampler))
    scrapes = []
    for _ in range(args.runs):
        began = time.perf_counter()
        generate_latest(registry)
        scrapes.append(time.perf_counter() - began)
    figures = {
        "devices": len(devices),
        "sample_ms": round(statistics.median(samples) * 1000, 2),
        "sample_max_ms": round(max(samples) * 1000, 2),
        "scrape_ms": round(statistics.median(scrapes) * 1000, 2),
        "scrape_max_ms": round(max(scrapes) * 1000, 2),
        "scrape_budget_ms": 50,
        "load": os.getloadavg()[0],
    }
    figures["met"] = figures["scrape_ms"] <= figures["scrape_budget_ms"]  # the median scrape; the exit status too
    print(json.dumps(figures, indent=1))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
