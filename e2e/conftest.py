"""The end-to-end suite, on one of two backends with the same test bodies:

- kind, where Docker, kind and kubectl exist: a real cluster with the driver (manifests/overlays/sim) as a
  DaemonSet on a simulated GPU node. Start it with e2e/run-kind.sh.
- the local node everywhere else: the `node` tests' real kubelet and containerd (scripts/build-node) on the real
  control plane (scripts/build-control-plane), `dradriver run` on a simulated GPU node as a host process. It is
  what `pytest` runs here and in CI; without those binaries it skips, or fails where the suite demands them
  (tests/support/required.py: DRADRIVER_REQUIRE_ALL=1 or DRADRIVER_REQUIRE_NODE=1).

E2E_BACKEND=kind or E2E_BACKEND=local picks one explicitly.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kindutil import DAEMONSET, NAMESPACE, ROOT, Backend, Cluster, kubectl_binary, run
from local_backend import LocalCluster
from support import required

REQUIRED_TOOLS = ("docker", "kind", "kubectl")
IMAGE = "dradriver:e2e"
# resource.k8s.io/v1 needs Kubernetes 1.34 or newer; override with KIND_NODE_IMAGE.
NODE_IMAGE = os.environ.get("KIND_NODE_IMAGE", "kindest/node:v1.35.0")


@functools.cache
def missing_tools() -> list[str]:
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if "docker" not in missing:
        probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            missing.append("a running Docker daemon")
    return missing


def backend() -> str:
    chosen = os.environ.get("E2E_BACKEND")
    if chosen:
        return chosen
    return "local" if missing_tools() else "kind"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.node if backend() == "local" else pytest.mark.e2e)
            # The local backend shares the worker (and so the control plane and node) of the cluster and node tests.
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if backend() == "local":
        yield LocalCluster(request.getfixturevalue("node"))
        return
    missing = missing_tools()
    if missing:
        required.need_tools(
            missing,
            "E2E_BACKEND=kind runs the scenarios on kind",
            "install Docker, kind and kubectl, or leave E2E_BACKEND unset for the local node",
        )
    yield from kind_cluster()


def kind_cluster() -> Iterator[Cluster]:
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
