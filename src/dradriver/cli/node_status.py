"""What ``dradriver run``'s status server answers: its probes, and ``/allocations`` for ``dradriver top``.

Until the driver serves, every answer says it is starting and what start-up waits for (the NVIDIA driver, say).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from dradriver.cli.flags.status import StatusOptions
from dradriver.cli.run_assembly import NodeDriver
from dradriver.cli.status_server import StatusServer
from dradriver.driver.observe.health import GpuHealth
from dradriver.gpu.inventory import GpuDevice, Inventory, LostGpu


class NodeStatus:
    """The node's state as the probes see it: ``waiting_for`` what start-up waits for (None once it serves),
    ``node`` the assembled driver and ``running`` whether it serves."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self.waiting_for: str | None = "starting"
        self.node: NodeDriver | None = None
        self.running = False

    def server(self, options: StatusOptions) -> StatusServer | None:
        """The status server answering from this (None with no ``--metrics-address``)."""
        if not options.address:
            return None
        return StatusServer(
            options.address, self.readiness, self.liveness, self.health, documents={"/allocations": self.allocations}
        )

    def _serving(self) -> NodeDriver | None:
        return self.node if self.running else None

    def _starting(self) -> dict[str, Any]:
        return {"starting": True, "waitingFor": self.waiting_for}

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """/livez: alive while both gRPC sockets answer. Nothing about the API server: a restart does not cure
        an API outage, so a failing publish must never make the liveness probe restart the pod. Alive while
        starting too: a restart would not bring the driver sooner."""
        node = self._serving()
        if node is None:
            return True, self._starting()
        answering = {
            "draSocket": socket_answers(node.plugin.dra_socket),
            "registrationSocket": socket_answers(node.plugin.registration_socket),
        }
        return all(answering.values()), answering

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: every check, the sockets and the last publish (kube-apiserver's convention)."""
        node = self._serving()
        if node is None:
            return False, self._starting()
        alive, detail = self.liveness()
        published = node.publisher.status
        return alive and published.ready, {
            **detail,
            "slicesPublished": published.ready,
            "publishError": published.last_error,
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """/readyz: the slices are published and the kubelet registered the plugin."""
        node = self._serving()
        if node is None:
            return False, self._starting()
        published = node.publisher.status
        registered = node.plugin.registration.status
        ready = published.ready and registered is not None and registered.registered
        return ready, {
            "slicesPublished": published.ready,
            "publishError": published.last_error,
            "registered": bool(registered and registered.registered),
        }

    def allocations(self) -> dict[str, Any]:
        """/allocations: whether the node is ready and its slices published (else the publish error), this node's
        GPUs with their health and MIG devices, the GPUs it lost, which pod holds which device and, when sampled,
        how busy each device is (``dradriver top`` reads it); empty, with what start-up waits for, until the driver
        serves."""
        node = self._serving()
        if node is None:
            return {
                "node": self.node_name,
                "waitingFor": self.waiting_for,
                "ready": False,
                "slicesPublished": False,
                "publishError": None,
                "gpus": [],
                "lostGpus": [],
                "allocations": [],
                "usage": [],
            }
        inventory = node.gpus.inventory
        held = [a.to_json() for a in node.allocations()]
        sample = node.usage.latest if node.usage is not None else None
        usage = sample.to_json() if sample is not None else []
        ready, _ = self.readiness()
        published = node.publisher.status
        return {
            "node": self.node_name,
            "ready": ready,
            "slicesPublished": published.ready,
            "publishError": published.last_error,
            "migMode": node.settings.mig_mode.value,
            "gpus": [gpu_entry(g, inventory, node.health) for g in inventory.gpus],
            "lostGpus": [lost_entry(g, node.health) for g in node.health.lost_gpus(inventory)],
            "allocations": held,
            "usage": usage,
        }


def gpu_entry(gpu: GpuDevice, inventory: Inventory, health: GpuHealth) -> dict[str, Any]:
    """One GPU of /allocations: who it is, its health, whether MIG is on and every MIG device that exists on it."""
    return {
        "name": gpu.name,
        "uuid": gpu.uuid,
        "productName": gpu.info.product_name,
        "index": gpu.info.index,
        "migEnabled": gpu.mig_enabled,
        "health": health.report(gpu.name),
        "migDevices": [
            {
                "name": d.name,
                "uuid": d.uuid,
                "profile": d.profile.name,
                "gpuInstanceId": d.existing.gpu_instance_id if d.existing else None,
                "health": health.report(d.name),
            }
            for d in inventory.mig_devices
            if d.parent.name == gpu.name
        ],
    }


def lost_entry(gpu: LostGpu, health: GpuHealth) -> dict[str, Any]:
    """One lost GPU of /allocations (``name`` and ``uuid`` null when it was lost before it could be read), with
    its health where it has a name to hold one."""
    entry: dict[str, Any] = {"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "reason": gpu.reason}
    if gpu.name is not None:
        entry["health"] = health.report(gpu.name)
    return entry


def socket_answers(path: Path, timeout: float = 1.0) -> bool:
    """Whether a gRPC server answers on the unix socket ``path`` (the channel becomes ready)."""
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()
