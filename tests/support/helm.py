"""The real helm (scripts/build-helm builds it from its Go module) and the chart in deployments/helm/dradriver.

Without helm the chart tests skip, saying how to build it, or fail where the suite demands it (support/required.py)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from support import required

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments/helm/dradriver"
PRESETS = tuple(sorted(p.stem for p in (CHART / "presets").glob("*.yaml")))
BUILD_SCRIPT = REPO / "scripts/build-helm"
# Release and namespace the kustomize tree (manifests/) is rendered with.
RELEASE = "dradriver"
NAMESPACE = "dradriver"


@functools.cache
def helm() -> str:
    """Path of the helm binary: $HELM, else what scripts/build-helm built; without one, see support/required.py."""
    path = required.named_or_built(BUILD_SCRIPT, env="HELM")
    if not os.access(path, os.X_OK):
        required.need(
            "helm",
            f"the chart tests run it; nothing at {path}",
            "build it with `scripts/build-helm` (Go >= 1.26 and the Go module proxy; `scripts/test` does)",
            tier=required.CLUSTER,
        )
    return path


def run_helm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=timeout, check=False)


def preset_file(preset: str) -> str:
    return str(CHART / "presets" / f"{preset}.yaml")


@functools.cache
def template(*args: str) -> tuple[dict[str, Any], ...]:
    """The objects ``helm template`` renders (release dradriver, namespace dradriver) with extra ``args``."""
    done = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render_preset(preset: str, *args: str) -> tuple[dict[str, Any], ...]:
    """The chart with one preset, as scripts/gen-manifests renders it for manifests/overlays/<preset>."""
    return template("--set", "createNamespace=true", "-f", preset_file(preset), *args)
