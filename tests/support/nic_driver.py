"""The topology recipe's second DRA driver on the real node: ``scripts/build-nic-driver``'s kubelet plugin
(``tools/nic-driver``, driver ``nic.example.com``) beside our `dradriver run`, registered with the same kubelet.

It reads NICs from sysfs as dranet does; here the sysfs is a stand-in tree (:func:`write_sysfs`) whose NICs sit
under the PCIe roots and NUMA nodes of the ``mixed`` profile's simulated GPUs, so the standard attributes
``resource.kubernetes.io/pcieRoot`` and ``numaNode`` it publishes (computed by upstream's ``deviceattribute``
helpers from that tree) can match ours. See docs/recipes/topology.md."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import required
from support.control_plane import Component
from support.real_node import RealNode, wait_for
from support.recipe_pages import documents, page_files

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-nic-driver"
NIC_DRIVER = "nic.example.com"


@dataclass(frozen=True)
class StandInNic:
    """One PCI network interface of the stand-in sysfs."""

    interface: str
    bus_id: str  # domain:bus:device.function
    pcie_root: str  # pci<domain>:<root bus>, the root complex it hangs under
    numa_node: int

    @property
    def device_name(self) -> str:
        """The device's name in the driver's ResourceSlice."""
        return "nic-" + self.bus_id.replace(":", "-").replace(".", "-")


# The mixed profile's GPUs sit under pci0000:00 and pci0000:40 (NUMA 0) and pci0000:80 (NUMA 1). One NIC under
# pci0000:00 and one under pci0000:80, none under pci0000:40, and one under pci0000:c0 where there is no GPU: a
# GPU and a NIC drawn at random often share neither root nor NUMA node, so only the constraint aligns them.
NICS = (
    StandInNic("ens1f0", "0000:0c:00.0", "pci0000:00", 0),
    StandInNic("ens2f0", "0000:8c:00.0", "pci0000:80", 1),
    StandInNic("ens3f0", "0000:c4:00.0", "pci0000:c0", 1),
)


def binary() -> Path:
    """The built NIC driver; missing, the test stops (a skip, or a failure under DRADRIVER_REQUIRE_NODE)."""
    path = required.built_by(BUILD_SCRIPT, dir_env="DRADRIVER_NIC_DRIVER_DIR", name="nic-driver")
    if not os.access(path, os.X_OK):
        required.need(
            "the NIC driver",
            f"the topology recipe runs a second DRA driver beside ours; {path} is not there",
            f"build it with `{BUILD_SCRIPT.relative_to(REPO)}` (see docs/recipes/topology.md; `scripts/test` does)",
            tier=required.NODE,
        )
    return path


def write_sysfs(root: Path, nics: tuple[StandInNic, ...] = NICS) -> Path:
    """A sysfs stand-in with ``nics`` as the kernel lays PCI NICs out: the device under its root port
    (``devices/pci0000:80/0000:80:01.0/0000:8c:00.0``, with ``numa_node`` and the network class), linked from
    ``bus/pci/devices/<bus id>`` and, through its ``net/<interface>``, from ``class/net/<interface>``."""
    for nic in nics:
        port = nic.pcie_root.removeprefix("pci") + ":01.0"  # the root port the NIC is behind
        device = root / "devices" / nic.pcie_root / port / nic.bus_id
        (device / "net" / nic.interface).mkdir(parents=True)
        (device / "numa_node").write_text(f"{nic.numa_node}\n")
        (device / "class").write_text("0x020000\n")
        for directory, target in (
            (root / "bus" / "pci" / "devices", device),
            (root / "class" / "net", device / "net" / nic.interface),
        ):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / target.name).symlink_to(os.path.relpath(target, directory))
    return root


class NicDriver:
    """The NIC driver as a host process for ``node``'s kubelet, publishing ``nics``; :meth:`stop` ends it and
    removes its slices."""

    def __init__(self, node: RealNode, nics: tuple[StandInNic, ...] = NICS) -> None:
        self.node = node
        self.nics = nics
        sysfs = node.root / "nic-driver" / "sys"
        shutil.rmtree(sysfs, ignore_errors=True)  # an earlier instance's, on this node
        self.sysfs = write_sysfs(sysfs, nics)
        self.process = Component(
            "nic-driver",
            [
                str(binary()),
                f"--driver-name={NIC_DRIVER}",
                f"--node-name={node.name}",
                f"--kubeconfig={node.control_plane.kubeconfig}",
                f"--sysfs-root={self.sysfs}",
                f"--registry-dir={node.kubelet.registry_dir}",
                f"--plugin-dir={node.kubelet.plugins_dir / NIC_DRIVER}",
                f"--cdi-dir={node.cdi_dir}",
            ],
            node.logs / "nic-driver.log",
        )

    def start(self) -> None:
        """Start it; returns once the kubelet has registered it and its slice lists every NIC."""
        self.process.start()
        self._wait("the kubelet to register the NIC driver", self.registered)
        self._wait("the NIC driver's ResourceSlice", lambda: len(self.devices()) == len(self.nics))

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        """Until ``done``; fails with the driver's log when it takes a minute or the driver exits."""
        try:
            wait_for(what, lambda: done() or not self.process.alive(), 60)
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}:\n{self.process.tail()}") from None
        if not self.process.alive():
            raise RuntimeError(f"the NIC driver exited:\n{self.process.tail()}")

    def registered(self) -> bool:
        return "kubelet registered the plugin" in self.process.tail(400)

    def devices(self) -> list[dict[str, Any]]:
        """The devices the driver's ResourceSlices for this node list."""
        found = self.node.kube.list(
            "resourceslices", fieldSelector=f"spec.nodeName={self.node.name},spec.driver={NIC_DRIVER}"
        )
        return [device for item in found for device in item["spec"].get("devices", [])]

    def stop(self) -> None:
        self.process.stop()
        for item in self.node.kube.list(
            "resourceslices", fieldSelector=f"spec.nodeName={self.node.name},spec.driver={NIC_DRIVER}"
        ):
            self.node.kube.delete("resourceslices", item["metadata"]["name"])


def device_class() -> dict[str, Any]:
    """The NIC DeviceClass as docs/recipes/topology.md gives it (``nic-deviceclass.yaml``)."""
    [found] = documents(page_files("topology.md")["nic-deviceclass.yaml"])
    return found


@contextmanager
def running_nic_driver(node: RealNode) -> Iterator[NicDriver]:
    """The NIC driver registered with ``node``'s kubelet, publishing :data:`NICS`, and its DeviceClass, for the body
    of the block; both gone after it (its slices too: no later claim may be allocated a NIC nobody prepares)."""
    driver = NicDriver(node)
    node.kube.delete("deviceclasses", NIC_DRIVER)  # a leftover of an interrupted run
    node.kube.create("deviceclasses", device_class())
    try:
        driver.start()
        yield driver
    finally:
        try:
            driver.stop()
        finally:
            node.kube.delete("deviceclasses", NIC_DRIVER)
