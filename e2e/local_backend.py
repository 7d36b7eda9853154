"""The e2e suite's second backend: the same test bodies against the `node` tests' local node (a real kubelet and
containerd from scripts/build-node, on the real control plane from scripts/build-control-plane), where Docker and
kind are missing. The driver runs there as a host process, not as the DaemonSet, so the few steps that touch the
DaemonSet are methods of the backend."""

from __future__ import annotations

import uuid
from pathlib import Path

from support.node_pods import Workloads, cdi_specs_of, claims_of, documents, pod_spec_of, status_devices
from support.real_node import RealNode, wait_for


class LocalCluster:
    """kubectl bound to the local node's API server; manifests pinned to the node (no registry: images never
    pulled) before they are applied."""

    backend = "local"

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self.node_config = f"{node.profile} --mig-mode {node.mig_mode}"
        self._workloads = Workloads(node)

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        return self._workloads.kubectl(*args, timeout=timeout, input=input)

    def apply(self, path: Path) -> None:
        self._workloads.apply(documents(path))

    def delete(self, path: Path) -> None:
        """Delete the example, then check what only this backend can see: the kubelet unprepared every claim
        its pods had (each claim's CDI spec is gone, its status.devices cleared)."""
        docs = documents(path)
        kube = self.node.kube
        pods = [pod for doc in docs if pod_spec_of(doc) is not None for pod in self._workloads.pods_of(doc)]
        claims = {c["metadata"]["uid"]: c for pod in pods for c in claims_of(kube, pod)}
        self._workloads.delete(reversed(docs), timeout=180)
        for uid, claim in claims.items():
            name = claim["metadata"]["name"]
            wait_for(f"the kubelet to unprepare claim {name}", lambda uid=uid: not cdi_specs_of(self.node, uid), 90)
            assert status_devices(kube, claim) == [], f"claim {name} kept status.devices after unprepare"

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
