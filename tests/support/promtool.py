"""Prometheus's promtool (scripts/build-promtool builds it from its Go module) and the chart's PrometheusRule.

Without promtool the tests that run it skip, saying how to build it, or fail where the suite demands it
(support/required.py)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

from support import required
from support.helm import template

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts/build-promtool"


@functools.cache
def promtool() -> str:
    """Path of promtool: $PROMTOOL, else what scripts/build-promtool built; without one, see support/required.py."""
    path = required.named_or_built(BUILD_SCRIPT, env="PROMTOOL")
    if not os.access(path, os.X_OK):
        required.need(
            "promtool",
            f"the alert rule tests run it; nothing at {path}",
            "build it with `scripts/build-promtool` (Go >= 1.26.7 and the Go module proxy; `scripts/test` does)",
        )
    return path


def run_promtool(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` in ``cwd`` (rule and test files name each other relative to it)."""
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def rendered_rule(*values: str) -> dict[str, Any]:
    """The chart's PrometheusRule with ``metrics.prometheusRule.enabled=true`` and ``values`` (``--set`` each)."""
    args = [a for v in ("metrics.prometheusRule.enabled=true", *values) for a in ("--set", v)]
    [rule] = [o for o in template(*args) if o["kind"] == "PrometheusRule"]
    return rule
