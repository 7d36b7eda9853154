"""The kind end-to-end suite: a real cluster with the driver (manifests/overlays/sim) running on a simulated
GPU node. Start it with e2e/run-kind.sh, or `pytest e2e -m e2e`.

Runs only where Docker, kind and kubectl exist; everywhere else every test is skipped, saying what is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindutil import DAEMONSET, NAMESPACE, ROOT, Cluster, kubectl_binary, run

REQUIRED_TOOLS = ("docker", "kind", "kubectl")
IMAGE = "dradriver:e2e"
# resource.k8s.io/v1 needs Kubernetes 1.34 or newer; override with KIND_NODE_IMAGE.
NODE_IMAGE = os.environ.get("KIND_NODE_IMAGE", "kindest/node:v1.35.0")


def missing_tools() -> list[str]:
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if "docker" not in missing:
        probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            missing.append("a running Docker daemon")
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    missing = missing_tools()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"kind e2e suite needs Docker, kind and kubectl: missing {', '.join(missing)}")
    for item in ours:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A kind cluster with the sim overlay installed and rolled out; deleted afterwards (unless
    E2E_KEEP_CLUSTER=1)."""
    name = f"dradriver-e2e-{uuid.uuid4().hex[:6]}"
    # The Dockerfile copies NVIDIA's nvidia-cdi-hook from build/ (docs/image.md).
    hook = run(str(ROOT / "scripts/build-cdi-hook"), timeout=1800).strip()
    (ROOT / "build").mkdir(exist_ok=True)
    shutil.copy2(hook, ROOT / "build/nvidia-cdi-hook")
    run("docker", "build", "-t", IMAGE, str(ROOT), timeout=900)
    config = str(ROOT / "e2e/kind-config.yaml")
    run("kind", "create", "cluster", "--name", name, "--image", NODE_IMAGE, "--config", config, "--wait", "180s",
        timeout=900)  # fmt: skip
    try:
        run("kind", "load", "docker-image", IMAGE, "--name", name, timeout=600)
        cluster = Cluster(f"kind-{name}")
        rendered = run(kubectl_binary(), "kustomize", str(ROOT / "manifests/overlays/sim"))
        cluster.kubectl(
            "apply", "--server-side", "-f", "-", input=re.sub(r"image: dradriver:\S+", f"image: {IMAGE}", rendered)
        )
        cluster.kubectl("-n", NAMESPACE, "rollout", "status", DAEMONSET, "--timeout=300s", timeout=320)
        yield cluster
    finally:
        if os.environ.get("E2E_KEEP_CLUSTER") != "1":
            subprocess.run(["kind", "delete", "cluster", "--name", name], capture_output=True, check=False, timeout=300)
