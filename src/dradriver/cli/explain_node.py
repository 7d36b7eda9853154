"""The simulated node ``dradriver explain --sim-profile`` allocates from, and the settings it is assumed to run with.

What a node offers depends on how the driver is installed: the chart's ``gpu.migMode`` (static by default: existing
MIG devices only), ``gpu.sharing`` and ``gpu.consumableShares``, and the cluster's release (up to 1.34 a MIG
device's counters sit in its own slice), and the opt-in features ``passthrough.enabled`` and
``fabricManagerPartitions.enabled``. explain builds the slices with the chart's defaults unless told otherwise,
says which it assumed, and when a claim does not fit, tries each other setting once, so that "does NOT fit" comes
with the flag (and chart value) that would make it fit, rather than leaving a user to find out on the cluster."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver.cli.flags.fabric_manager import FABRIC_MANAGER_PARTITIONS
from dradriver.cli.flags.passthrough import PASSTHROUGH
from dradriver.cli.flags.publishing import KUBERNETES_VERSION
from dradriver.cli.flags.sharing import CONSUMABLE_SHARES, GPU_SHARING
from dradriver.computedomain import api as cd_api
from dradriver.computedomain.node import slice_devices

if TYPE_CHECKING:
    from dradriver.driver.publish.slices import SliceSettings
    from dradriver.gpu.backend import OpenedBackend
    from dradriver.gpu.fabric_manager import FabricPartition
    from dradriver.gpu.inventory import Inventory
    from dradriver.nvidia_install.pci_binding import HostPci

#: MIG modes in the order alternatives are tried.
MIG_MODES = ("static", "dynamic", "none")
#: Consumable shares tried as an alternative: the chart's ``gpu.consumableShares: memory``.
SHARES_TRIED = "memory"


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """How the simulated node's driver publishes: the values of the chart (and flags of ``run``) that shape its
    ResourceSlices. The defaults are the chart's."""

    mig_mode: str = "static"
    gpu_sharing: str = "exclusive"
    consumable_shares: str | None = None
    kubernetes_version: str = "1.35"
    fabric_partitions: bool = False
    passthrough: bool = False
    #: The ComputeDomain driver's names (``--compat``): whose channel and daemon a clique's node publishes.
    compute_domains: cd_api.ComputeDomainNames = cd_api.OURS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NodeSettings:
        return cls(
            mig_mode=args.mig_mode,
            gpu_sharing=GPU_SHARING.value(args),
            consumable_shares=CONSUMABLE_SHARES.value(args) or None,
            kubernetes_version=KUBERNETES_VERSION.value(args),
            fabric_partitions=FABRIC_MANAGER_PARTITIONS.value(args) == "true",
            passthrough=PASSTHROUGH.value(args) == "true",
            compute_domains=cd_api.names_of(args.compat),
        )

    def describe(self) -> str:
        """The settings as flags with their chart values, for the "assuming" line."""
        sharing = (
            f"--consumable-shares {self.consumable_shares} (gpu.consumableShares)"
            if self.consumable_shares
            else f"--gpu-sharing {self.gpu_sharing} (gpu.sharing)"
        )
        partitions = (
            ", --fabric-manager-partitions true (fabricManagerPartitions.enabled)" if self.fabric_partitions else ""
        )
        passthrough = ", --passthrough true (passthrough.enabled)" if self.passthrough else ""
        return (
            f"--mig-mode {self.mig_mode} (gpu.migMode), {sharing}{partitions}{passthrough}, "
            f"--kubernetes-version {self.kubernetes_version} (the chart's kubernetesVersion, read from the API server "
            "when unset)"
        )

    def alternatives(self) -> list[tuple[NodeSettings, str]]:
        """Each other setting, changed one at a time, with the flag and chart value that choose it."""
        tried: list[tuple[NodeSettings, str]] = [
            (replace(self, mig_mode=mode), f"--mig-mode {mode} (chart value gpu.migMode: {mode})")
            for mode in MIG_MODES
            if mode != self.mig_mode
        ]
        if self.gpu_sharing == "exclusive" and not self.consumable_shares:
            tried += [
                (
                    replace(self, gpu_sharing="consumable"),
                    "--gpu-sharing consumable (chart value gpu.sharing: consumable)",
                ),
                (
                    replace(self, consumable_shares=SHARES_TRIED, mig_mode="static"),
                    f"--consumable-shares {SHARES_TRIED} (chart value gpu.consumableShares: {SHARES_TRIED})"
                    + ("" if self.mig_mode == "static" else " with --mig-mode static (gpu.migMode: static)"),
                ),
            ]
        if not self.fabric_partitions:
            tried.append(
                (
                    replace(self, fabric_partitions=True),
                    "--fabric-manager-partitions true (chart value fabricManagerPartitions.enabled: true)",
                )
            )
        if not self.passthrough:
            tried.append(
                (replace(self, passthrough=True), "--passthrough true (chart value passthrough.enabled: true)")
            )
        return [(settings, how) for settings, how in tried if settings.release_problem() is None]

    def release_problem(self) -> str | None:
        """What the cluster's release cannot take of these settings (dynamic MIG before 1.33, …), or None."""
        from dradriver.driver.publish.slices import release_problem

        return release_problem(self.kubernetes_version, self._slice_settings(""))

    def _slice_settings(self, driver: str) -> SliceSettings:
        from dradriver.driver.publish.slices import SliceSettings, shape_for
        from dradriver.gpu.inventory import MigMode

        return SliceSettings(
            driver=driver,
            mig_mode=MigMode(self.mig_mode),
            gpu_sharing=self.gpu_sharing,
            consumable_shares=self.consumable_shares,
            shape=shape_for(self.kubernetes_version),
        )

    def slices(self, profile: str, driver: str) -> list[dict[str, Any]]:
        """The ResourceSlices a simulated node of ``profile`` publishes with these settings, built by the driver's
        own slice builder (with ``passthrough``, its passthrough devices as ``run --passthrough true`` publishes them,
        sharing their GPUs' counters). The node (and pool) is named after the profile: "fits on node
        dgx-a100-80gb"."""
        from dradriver.computedomain.fabric import clique_id
        from dradriver.driver.prepare.partitions import gpu_attributes
        from dradriver.driver.publish.slices import as_resource_slices, build_slice_specs
        from dradriver.gpu.backend import open_gpu_backend, sim_profile_name
        from dradriver.gpu.inventory import discover

        node = sim_profile_name(profile)
        # The passthrough devices are read from the simulated node's sysfs tree, written here for this one look.
        with tempfile.TemporaryDirectory(prefix="dradriver-explain-") as host_root:
            opened = open_gpu_backend("sim", sim_profile=profile, node_name=node)
            gpulib = opened[0]
            try:
                pci = self._host_pci(opened, Path(host_root))  # before discovery, as run attaches it
                inventory = discover(gpulib)
                clique = clique_id(gpulib)
                partitions = self._partitions(opened)
                vfio = passthrough_specs(pci, inventory) if pci is not None else []
            finally:
                gpulib.close()
        settings = replace(self._slice_settings(driver), gpu_attributes=gpu_attributes(partitions))
        specs = self._with_passthrough(build_slice_specs(inventory, settings), vfio, settings)
        return as_resource_slices(specs, node_name=node, driver=driver) + compute_domain_slices(
            clique, node, self.compute_domains
        )

    def _partitions(self, opened: OpenedBackend) -> Sequence[FabricPartition]:
        """Fabric Manager's partitions of an NVSwitch node (its stand-in's), with ``fabric_partitions``."""
        from dradriver.gpu.backend import simulated_fabric_manager

        simulated = opened[1]
        if not self.fabric_partitions or simulated is None or not simulated.profile.nvswitch:
            return []
        return simulated_fabric_manager(simulated).supported_partitions()

    def _host_pci(self, opened: OpenedBackend, host_root: Path) -> HostPci | None:
        """With ``passthrough``: the simulated node's sysfs tree, written under ``host_root`` as ``run --passthrough
        true`` writes it under its plugin directory."""
        from dradriver.gpu.backend import attach_simulated_sysfs
        from dradriver.nvidia_install.pci_binding import HostPci

        simulated = opened[1]
        if not self.passthrough or simulated is None:
            return None
        return HostPci(host_root, attach_simulated_sysfs(simulated, host_root))

    @staticmethod
    def _with_passthrough(
        specs: list[dict[str, Any]], vfio: list[dict[str, Any]], settings: SliceSettings
    ) -> list[dict[str, Any]]:
        """The pool's slice specs as ``run`` assembles them: the passthrough devices with their GPUs' Fabric Manager
        attributes, consuming their GPUs' counters."""
        from dradriver.driver.prepare.partitions import with_gpu_attributes
        from dradriver.driver.publish.passthrough import share_gpu_counters

        vfio = with_gpu_attributes(vfio, settings.gpu_attributes)
        return share_gpu_counters(specs, vfio, shape=settings.shape)


def passthrough_specs(pci: HostPci, inventory: Inventory) -> list[dict[str, Any]]:
    """The passthrough devices the driver's catalog finds in ``pci``, as the slice specs ``run`` publishes."""
    from dradriver.driver.prepare.vfio import PassthroughCatalog
    from dradriver.driver.publish.passthrough import passthrough_slice_specs

    return passthrough_slice_specs(PassthroughCatalog(pci).devices(inventory))


def compute_domain_slices(
    clique: str, node: str, names: cd_api.ComputeDomainNames = cd_api.OURS
) -> list[dict[str, Any]]:
    """A node in a multi-node NVLink clique also publishes the ComputeDomain driver's channel and daemon, under
    ``names``' driver."""
    if not clique:
        return []
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{names.driver_name}"},
            "spec": {
                "driver": names.driver_name,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": slice_devices(clique),
            },
        }
    ]
