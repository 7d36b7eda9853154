"""The kind end-to-end suite: a real cluster with the driver running on a simulated GPU node.

Runs only where Docker and kind (and kubectl) exist; everywhere else every test is skipped, saying what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindutil import run

ROOT = Path(__file__).resolve().parent.parent
REQUIRED_TOOLS = ("docker", "kind", "kubectl")
IMAGE = "dradriver:e2e"
# DRA's resource.k8s.io/v1 needs Kubernetes 1.34 or newer; override with KIND_NODE_IMAGE.
NODE_IMAGE = os.environ.get("KIND_NODE_IMAGE", "kindest/node:v1.34.0")


def missing_tools() -> list[str]:
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if "docker" not in missing:
        probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            missing.append("a running Docker daemon")
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = missing_tools()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"kind e2e suite needs Docker and kind: missing {', '.join(missing)}")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """A kind cluster with the driver deployed on a simulated dgx-a100-80gb node; deleted afterwards."""
    name = f"dradriver-e2e-{uuid.uuid4().hex[:6]}"
    run("docker", "build", "-t", IMAGE, str(ROOT), timeout=900)
    run("kind", "create", "cluster", "--name", name, "--image", NODE_IMAGE, "--wait", "120s", timeout=600)
    try:
        run("kind", "load", "docker-image", IMAGE, "--name", name)
        context = f"kind-{name}"
        for folder in ("manifests/driver/namespace.yaml", "manifests/driver", "manifests/deviceclasses"):
            run("kubectl", "--context", context, "apply", "-f", str(ROOT / folder))
        run(
            "kubectl",
            "--context",
            context,
            "-n",
            "dradriver",
            "set",
            "image",
            "daemonset/dradriver-kubelet-plugin",
            f"plugin={IMAGE}",
        )
        run(
            "kubectl",
            "--context",
            context,
            "-n",
            "dradriver",
            "set",
            "env",
            "daemonset/dradriver-kubelet-plugin",
            "DRADRIVER_GPU_BACKEND=sim",
            "DRADRIVER_SIM_PROFILE=dgx-a100-80gb",
            "DRADRIVER_MIG_MODE=none",
        )
        run(
            "kubectl",
            "--context",
            context,
            "-n",
            "dradriver",
            "rollout",
            "status",
            "daemonset/dradriver-kubelet-plugin",
            "--timeout=180s",
        )
        yield context
    finally:
        subprocess.run(["kind", "delete", "cluster", "--name", name], capture_output=True, check=False, timeout=300)
