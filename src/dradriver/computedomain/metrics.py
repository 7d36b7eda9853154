"""The ComputeDomain controller's Prometheus metrics (``dradriver cd-controller --metrics-address``): whether this
replica leads, its passes (how many, how they ended, how long they took), the domains that failed to reconcile,
the domains by status as the last pass found them, and its writes to the API server. Named as the driver's are
(``driver/observe/metrics.py``); docs/computedomains.md lists them."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from dradriver.computedomain import api

LEADING = Gauge("dradriver_computedomain_controller_leading", "1 while this controller replica holds the Lease")
PASSES = Counter(
    "dradriver_computedomain_controller_passes_total",
    "Passes over every ComputeDomain, by outcome (error: the pass could not read the cluster)",
    ["outcome"],
)
PASS_DURATION = Histogram(
    "dradriver_computedomain_controller_pass_duration_seconds",
    "Time one pass over every ComputeDomain took",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
RECONCILE_ERRORS = Counter(
    "dradriver_computedomain_reconcile_errors_total",
    "ComputeDomains a pass could not converge or delete, by operation (the log names the domain and the cause)",
    ["operation"],
)
INFORMER_UNSYNCED = Gauge(
    "dradriver_computedomain_informer_unsynced",
    "1 while an informer of the leader has not synced its cache within --sync-timeout of the term's start (its "
    "list fails: the log says why); nothing is reconciled meanwhile",
    ["informer"],
)
RECONCILES = Counter(
    "dradriver_computedomain_reconciles_total",
    "Reconciles of one domain from the informers' caches, by outcome (retry: tried again with backoff)",
    ["outcome"],
)
RECONCILE_DURATION = Histogram(
    "dradriver_computedomain_reconcile_duration_seconds",
    "Time the reconcile of one domain took",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
DOMAINS = Gauge(
    "dradriver_computedomains",
    "ComputeDomains by status (Ready, NotReady, Deleting) as the leader's last pass found them",
    ["status"],
)


_shown: set[str] = set()  # the status labels DOMAINS has now


def record_domains(domains: Iterable[dict[str, Any]]) -> None:
    """Set :data:`DOMAINS` from one pass's list of ComputeDomains: the three known statuses always (0 when none),
    another only while some domain has it."""
    counts = Tally(
        "Deleting" if d["metadata"].get("deletionTimestamp") else (d.get("status") or {}).get("status") or api.NOT_READY
        for d in domains
    )
    now = {api.READY, api.NOT_READY, "Deleting", *counts}
    for status in _shown - now:
        DOMAINS.remove(status)
    for status in now:
        DOMAINS.labels(status).set(counts.get(status, 0))
    _shown.clear()
    _shown.update(now)


def forget_domains() -> None:
    """No :data:`DOMAINS` series at all (a standby)."""
    DOMAINS.clear()
    _shown.clear()


class ApiWrites(Collector):
    """``dradriver_computedomain_api_writes_total{verb, resource}``, read at scrape time from a tally of
    mutating requests ("VERB resource" → count, as ``computedomain.kube.Rest.writes_so_far`` gives it)."""

    def __init__(self, writes: Callable[[], Mapping[str, int]]) -> None:
        self._writes = writes

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "dradriver_computedomain_api_writes",
            "Mutating requests the controller sent to the API server, by verb and resource",
            labels=["verb", "resource"],
        )
        for key, count in sorted(self._writes().items()):
            verb, _, resource = key.partition(" ")
            family.add_metric([verb, resource], count)
        yield family


class ApiReads(Collector):
    """``dradriver_computedomain_api_reads_total{verb, resource}``: GETs, LISTs and WATCHes the controller sent
    ("VERB resource" → count, as ``computedomain.kube.Rest.reads_so_far`` gives it)."""

    def __init__(self, reads: Callable[[], Mapping[str, int]]) -> None:
        self._reads = reads

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "dradriver_computedomain_api_reads",
            "Reading requests the controller sent to the API server (GET, LIST, WATCH), by verb and resource",
            labels=["verb", "resource"],
        )
        for key, count in sorted(self._reads().items()):
            verb, _, resource = key.partition(" ")
            family.add_metric([verb, resource], count)
        yield family
