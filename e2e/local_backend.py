"""The e2e suite's second backend: the same test bodies against the `node` tests' local node (a real kubelet and
containerd from scripts/build-node, on the real control plane from scripts/build-control-plane), where Docker and
kind are missing. The driver runs there as a host process, not as the DaemonSet, so the few steps that touch the
DaemonSet are methods of the backend."""

from __future__ import annotations

import uuid
from pathlib import Path

from support.node_pods import Workloads, documents
from support.real_node import RealNode


class LocalCluster:
    """kubectl bound to the local node's API server; manifests pinned to the node (no registry: images never
    pulled) before they are applied."""

    backend = "local"

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self._workloads = Workloads(node)

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        return self._workloads.kubectl(*args, timeout=timeout, input=input)

    def apply(self, path: Path) -> None:
        self._workloads.apply(documents(path))

    def delete(self, path: Path) -> None:
        self._workloads.delete(reversed(documents(path)), timeout=180)

    def roll_driver(self) -> None:
        """A rolling update of the driver: a second instance beside the first (per-pod socket names), the
        kubelet moves to it, the first stops, as the DaemonSet's maxSurge update does."""
        node = self.node
        old = node.driver
        if not old.pod_uid:
            node.stop_driver(old)
            old = node.start_driver(pod_uid=f"e2e-{uuid.uuid4().hex[:8]}")
        node.start_driver(pod_uid=f"e2e-{uuid.uuid4().hex[:8]}")
        node.stop_driver(old)
