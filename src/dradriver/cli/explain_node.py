"""The simulated node ``dradriver explain --sim-profile`` allocates from, and the settings it is assumed to run with.

What a node offers depends on how the driver is installed: the chart's ``gpu.migMode`` (static by default: existing
MIG devices only), ``gpu.sharing`` and ``gpu.consumableShares``, and the cluster's release (up to 1.34 a MIG
device's counters sit in its own slice). explain builds the slices with the chart's defaults unless told otherwise,
says which it assumed, and when a claim does not fit, tries each other setting once, so that "does NOT fit" comes
with the flag (and chart value) that would make it fit, rather than leaving a user to find out on the cluster."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from dradriver.cli.flags.fabric_manager import FABRIC_MANAGER_PARTITIONS
from dradriver.cli.flags.publishing import KUBERNETES_VERSION
from dradriver.cli.flags.sharing import CONSUMABLE_SHARES, GPU_SHARING
from dradriver.computedomain import api as cd_api
from dradriver.computedomain.node import slice_devices

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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NodeSettings:
        return cls(
            mig_mode=args.mig_mode,
            gpu_sharing=GPU_SHARING.value(args),
            consumable_shares=CONSUMABLE_SHARES.value(args) or None,
            kubernetes_version=KUBERNETES_VERSION.value(args),
            fabric_partitions=FABRIC_MANAGER_PARTITIONS.value(args) == "true",
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
        return (
            f"--mig-mode {self.mig_mode} (gpu.migMode), {sharing}{partitions}, "
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
        return [(settings, how) for settings, how in tried if settings.release_problem() is None]

    def release_problem(self) -> str | None:
        """What the cluster's release cannot take of these settings (dynamic MIG before 1.33, …), or None."""
        from dradriver.driver.publish.slices import release_problem

        return release_problem(self.kubernetes_version, self._slice_settings(""))

    def _slice_settings(self, driver: str) -> Any:
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
        own slice builder. The node (and pool) is named after the profile: "fits on node dgx-a100-80gb"."""
        from dradriver.computedomain.fabric import clique_id
        from dradriver.driver.prepare.partitions import gpu_attributes
        from dradriver.driver.publish.slices import as_resource_slices, build_slice_specs
        from dradriver.gpu.backend import open_gpu_backend, sim_profile_name, simulated_fabric_manager
        from dradriver.gpu.inventory import discover

        node = sim_profile_name(profile)
        gpulib, simulated = open_gpu_backend("sim", sim_profile=profile, node_name=node)
        try:
            inventory = discover(gpulib)
            clique = clique_id(gpulib)
            partitions = (
                simulated_fabric_manager(simulated).supported_partitions()
                if self.fabric_partitions and simulated is not None and simulated.profile.nvswitch
                else []
            )
        finally:
            gpulib.close()
        settings = replace(self._slice_settings(driver), gpu_attributes=gpu_attributes(partitions))
        specs = build_slice_specs(inventory, settings)
        return as_resource_slices(specs, node_name=node, driver=driver) + compute_domain_slices(clique, node)


def compute_domain_slices(clique: str, node: str) -> list[dict[str, Any]]:
    """A node in a multi-node NVLink clique also publishes the ComputeDomain driver's channel and daemon."""
    if not clique:
        return []
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{cd_api.DRIVER_NAME}"},
            "spec": {
                "driver": cd_api.DRIVER_NAME,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": slice_devices(clique),
            },
        }
    ]
