"""The e2e suite's second backend: the same test bodies against the `node` tests' local node (a real kubelet and
containerd from scripts/build-node, on the real control plane from scripts/build-control-plane), where Docker and
kind are missing. The driver runs there as a host process, not as the DaemonSet, so the few steps that touch the
DaemonSet are methods of the backend."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.nic_driver import NIC_DRIVER, running_nic_driver
from support.node_pods import Workloads, claims_of, documents, pod_spec_of, status_devices, unprepared
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

    def own_nodes(self) -> set[str]:
        return {self.node.name}

    def apply(self, path: Path) -> None:
        self._workloads.apply(documents(path))

    def delete(self, path: Path) -> None:
        """Delete the example, then check what only this backend can see: the kubelet unprepared every claim
        its pods had (each claim's CDI spec and checkpoint record are gone, its status.devices cleared)."""
        docs = documents(path)
        kube = self.node.kube
        pods = [pod for doc in docs if pod_spec_of(doc) is not None for pod in self._workloads.pods_of(doc)]
        claims = {c["metadata"]["uid"]: c for pod in pods for c in claims_of(kube, pod)}
        self._workloads.delete(reversed(docs), timeout=180)
        for uid, claim in claims.items():
            name = claim["metadata"]["name"]
            wait_for(f"the kubelet to unprepare claim {name}", lambda uid=uid: unprepared(self.node, uid), 90)
            # The driver clears status.devices from a queue after unprepare returns.
            wait_for(f"claim {name} to lose status.devices", lambda claim=claim: status_devices(kube, claim) == [], 30)

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

    @contextlib.contextmanager
    def configured(self, node_config: str) -> Iterator[None]:
        """The node as an example's "# Node:" header names it (same profile, other flags), for the body of the
        block: the driver restarts with those flags and, after the block, with the node's own again. The node's
        slices are waited for both times, so the scheduler never allocates from the other configuration."""
        if node_config == self.node_config:
            yield
            return
        profile, *flags = node_config.split()
        if profile != self.node.profile or "--mig-mode" not in flags[:-1]:
            pytest.skip(f"written for a node {node_config!r}; this one is {self.node_config!r} (profiles differ)")
        at = flags.index("--mig-mode")
        mig_mode, rest = flags[at + 1], (*flags[:at], *flags[at + 2 :])
        own = wait_for(f"the slices of the {self.node_config!r} node", self._slices, 90)
        self._restart(mig_mode=mig_mode, extra=rest)
        wait_for(f"the slices of a {node_config!r} node", lambda: self._published_other_than(own), 90)
        try:
            yield
        finally:
            self._restart(mig_mode=None, extra=())
            wait_for(f"the slices of a {self.node_config!r} node", lambda: self._slices() == own, 90)

    @contextlib.contextmanager
    def with_driver(self, needs: str) -> Iterator[None]:
        """The NIC driver (support.nic_driver: scripts/build-nic-driver's, NICs on the simulated GPUs' PCIe roots)
        and its DeviceClass beside our driver, for the body of the block; any other driver skips."""
        wanted = needs.split(maxsplit=1)[0].rstrip(",")
        if wanted != NIC_DRIVER:
            pytest.skip(f"needs {needs}: this node runs only the NIC driver {NIC_DRIVER} beside ours")
        with running_nic_driver(self.node):
            yield

    def _restart(self, *, mig_mode: str | None, extra: tuple[str, ...]) -> None:
        node = self.node
        assert not node.prepared_claims(), f"claims still prepared before a reconfiguration: {node.prepared_claims()}"
        node.stop_driver(node.driver)
        node.start_driver(mig_mode=mig_mode, extra=extra)

    def _slices(self) -> list[Any] | None:
        """The node's pool as the driver last published it in full (None while a publish is half done)."""
        found = self.node.kube.list(
            "resourceslices", fieldSelector=f"spec.nodeName={self.node.name},spec.driver={self.node.driver_name}"
        )
        pools = {json.dumps(s["spec"]["pool"], sort_keys=True) for s in found}
        if len(pools) != 1 or len(found) != found[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        specs = [(s["spec"].get("devices", []), s["spec"].get("sharedCounters", [])) for s in found]
        return sorted(specs, key=lambda spec: json.dumps(spec, sort_keys=True))

    def _published_other_than(self, before: list[Any] | None) -> bool:
        now = self._slices()
        return now is not None and now != before
