"""The node side's API requests at rest against their budgets (docs/performance.md, "Cluster scale"): `dradriver
run` (simulated DGX H100, dynamic MIG, the GPU driver alone) and `dradriver run --compute-domains true` (a simulated
GB200 tray: the GPU driver and the ComputeDomain node plugin in one process, on the chart's plugin account), each
serving its Node with its default intervals, counted from the API server's audit log over a minute of rest
(support/request_budget.py). A change that adds a poll fails here with what the component asked for."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import required
from support.cluster_fixtures import failures
from support.control_plane import BUILD_SCRIPT, REPO, binaries_dir, missing_binaries
from support.request_budget import BUDGETS, Tally, measure_rest, resting_components

REST_SECONDS = 60.0


@pytest.fixture(scope="module")
def rest() -> Iterator[dict[str, Tally]]:
    if missing_binaries(binaries_dir()):
        required.need("the real control plane", "the request budget is read from its audit log",
                      f"build it with `{BUILD_SCRIPT.relative_to(REPO)}`", tier=required.CLUSTER)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="dra-budget-", dir="/tmp"))
    failed_before = failures()
    with resting_components(root) as (plane, components):
        yield measure_rest(plane, components, REST_SECONDS)
    if failures() > failed_before:
        sys.stderr.write(f"\nrequest budget test failed: logs (the audit log among them) kept in {root / 'logs'}\n")
    else:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("component", sorted(BUDGETS))
def test_component_at_rest_stays_within_its_budget(rest: dict[str, Tally], component: str) -> None:
    measured, budget = rest[component], BUDGETS[component]
    assert measured.requests_per_minute <= budget.requests, measured.as_dict()
    assert measured.watches_per_minute <= budget.watches, measured.as_dict()
