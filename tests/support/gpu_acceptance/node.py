"""One ``dradriver run`` under test: started against the API stand-in, registered by the kubelet-like client, its
claims allocated by our allocator from what it published (as the scheduler would) and prepared over gRPC.
Runs inside the kit's venv.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dradriver.allocator.allocator import allocate
from dradriver.plugin.kubeletplugin.kubelet_client import (
    Claim,
    KubeletClient,
    PreparedClaim,
    RegisteredPlugin,
    discover,
)
from support.apiserver import FakeApiServer
from support.gpu_acceptance.session import DRIVER, NODE, DriverProcess, NodeDirs, SessionConfig, eventually, run_command

CONFIG_API = "gpu.dradriver.dev/v1alpha1"
POD = "acceptance-pod"


def device_classes(repo: Path) -> list[dict[str, Any]]:
    """The chart's DeviceClasses (manifests/deviceclasses), as the cluster would have them."""
    found = []
    for path in sorted((repo / "manifests/deviceclasses").glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def attribute(device: dict[str, Any], name: str) -> Any:
    """A device attribute's value, whatever its type (``{"string": ...}``, ``{"version": ...}``, ...)."""
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None)


@dataclass
class Node:
    """A running driver with its directories, and the kubelet's connection to it once registered."""

    cfg: SessionConfig
    api: FakeApiServer
    dirs: NodeDirs
    driver: DriverProcess
    classes: list[dict[str, Any]]
    plugin: RegisteredPlugin | None = None
    allocated: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, cfg: SessionConfig, api: FakeApiServer, label: str, extra: list[str]) -> tuple[Node, str]:
        """Start ``dradriver run`` (``extra`` flags added); the node and '' once it serves, else why not."""
        dirs = NodeDirs(Path(cfg.work) / label).make()
        kubeconfig = api.write_kubeconfig(dirs.base / "kubeconfig")
        driver = DriverProcess(run_command(cfg, dirs, kubeconfig, extra), Path(cfg.logs) / f"driver-{label}.log")
        node = cls(cfg, api, dirs, driver, device_classes(Path(cfg.repo)))
        return node, driver.wait_ready(90)

    def register(self) -> RegisteredPlugin:
        """The kubelet's registration handshake with the driver's socket (waiting up to 30 s for it)."""
        if not eventually(lambda: discover(self.dirs.registry), 30):
            raise AssertionError(f"no registration socket in {self.dirs.registry} after 30 s: {self.driver.tail()}")
        self.plugin = KubeletClient(self.dirs.registry).register()
        return self.plugin

    def close(self) -> int:
        """Drop the kubelet's connection and stop the driver; its exit status."""
        if self.plugin is not None:
            self.plugin.close()
        return self.driver.stop()

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.list("resourceslices") if s["spec"]["driver"] == DRIVER]

    def published(self) -> list[dict[str, Any]]:
        """The pool's slices once all of them are there (waiting up to 30 s), else what there is."""

        def complete() -> list[dict[str, Any]]:
            found = self.slices()
            count = found[0]["spec"]["pool"]["resourceSliceCount"] if found else -1
            return found if len(found) == count else []

        return eventually(complete, 30) or self.slices()

    def gpus(self) -> list[dict[str, Any]]:
        """The whole-GPU devices published, in slice order."""
        return [d for s in self.slices() for d in s["spec"].get("devices", []) if attribute(d, "type") == "gpu"]

    def claim(
        self, name: str, *, config: dict[str, Any] | None = None, capacity: dict[str, str] | None = None
    ) -> Claim:
        """A claim for one whole GPU, allocated by our allocator from the published slices (as the scheduler
        would, beside the claims already allocated here), reserved for a pod, stored in the API stand-in."""
        request: dict[str, Any] = {"deviceClassName": DRIVER}
        if capacity:
            request["capacity"] = {"requests": capacity}
        devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": request}]}
        if config is not None:
            devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API, **config}}}]
        obj: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": devices},
        }
        allocation = allocate(
            copy.deepcopy(obj), slices=self.slices(), classes=self.classes, node=NODE, allocated=self.allocated
        )
        obj["status"] = {
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": POD, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name))}],
        }
        created = self.api.create("resourceclaims", obj, namespace="default")
        self.allocated.append(created)
        return Claim("default", name, created["metadata"]["uid"])

    def forget(self, claim: Claim) -> None:
        """The claim deleted, as when its pod is gone (after unprepare)."""
        self.allocated = [c for c in self.allocated if c["metadata"]["uid"] != claim.uid]
        self.api.delete("resourceclaims", claim.name, "default")

    def prepare(self, claim: Claim) -> PreparedClaim:
        assert self.plugin is not None, "not registered"
        return self.plugin.prepare([claim], timeout=120)[claim.uid]

    def unprepare(self, claim: Claim) -> str:
        """NodeUnprepareResources of one claim: its error ('' when it went)."""
        assert self.plugin is not None, "not registered"
        return self.plugin.unprepare([claim], timeout=120).get(claim.uid, "no answer for the claim")
