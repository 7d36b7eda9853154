"""``dradriver inventory``: print the node's devices as discovery sees them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from dradriver.cli.flags import gpus, publishing
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.flags.node_dirs import PLUGIN_DIR, STATE_DIR
from dradriver.cli.flags.output import add_output_option
from dradriver.cli.flags.publishing import apply_compat
from dradriver.driver.observe.health import GpuHealth, HealthPolicy
from dradriver.driver.publish import slice_map
from dradriver.driver.publish.slice_map import InstanceCell, owners_from_checkpoint
from dradriver.driver.publish.slices import (
    SliceSettings,
    as_resource_slices,
    build_slice_specs,
    release_problem,
    shape_for,
)
from dradriver.errors import ConfigError
from dradriver.gpu.backend import open_gpu_backend
from dradriver.gpu.inventory import GpuDevice, Inventory, MigMode, MigPartition, discover
from dradriver.gpu.models import MigProfile
from dradriver.inputs import path_exists
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Discover GPUs (through NVML, or a simulated node) and print what the driver would offer; "
        "-o slices prints the ResourceSlices it would publish."
    )
    gpus.add_flags(parser)
    NODE_NAME.add(parser, default="sim-node", help="node name (names the simulated node's GPUs)")
    PLUGIN_DIR.add(
        parser,
        help=f"the running driver's plugin directory, whose health.json holds device health and taints "
        f"(default: {DEFAULT_PLUGINS_DIR}/<driver-name>)",
    )
    publishing.add_flags(parser)
    STATE_DIR.add(
        parser,
        help="the running driver's state directory (default: the plugin directory): the slice maps name the "
        "claim that owns each MIG instance",
    )
    add_output_option(parser, ("table", "json", "yaml", "slices"), "table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    apply_compat(args)
    inventory = load_inventory(args)
    mode = MigMode(args.mig_mode)
    plugin_dir = Path(args.plugin_dir) if args.plugin_dir else DEFAULT_PLUGINS_DIR / args.driver_name
    # What the running driver knows (XIDs, ECC errors) plus what discovery sees now (lost GPUs).
    health = GpuHealth(
        inventory=inventory,
        mig_mode=mode,
        pool=args.node_name,
        policy=HealthPolicy(taint_domain=args.driver_name),
        state_path=plugin_dir / "health.json",
        save_state=False,
    )
    if args.output == "table":
        sys.stdout.write(render_table(inventory, mode, health))
        sys.stdout.write(render_slice_maps(inventory, owners_from_checkpoint(_state_dir(args, plugin_dir))))
    elif args.output == "slices":
        settings = SliceSettings(driver=args.driver_name, mig_mode=mode, shape=shape_for(args.kubernetes_version))
        problem = release_problem(args.kubernetes_version, settings)
        if problem:  # what `run` refuses on that release: never print slices its API server would not take
            raise ConfigError(problem)
        slices = as_resource_slices(
            build_slice_specs(inventory, settings, taints=health.taints),
            node_name=args.node_name,
            driver=args.driver_name,
        )
        sys.stdout.write(yaml.safe_dump_all(slices, sort_keys=False))
    else:
        document = inventory_document(inventory, mode, node=args.node_name, health=health)
        if args.output == "json":
            sys.stdout.write(json.dumps(document, indent=2) + "\n")
        else:
            sys.stdout.write(yaml.safe_dump(document, sort_keys=False))
    return 0


def render_slice_maps(inventory: Inventory, owned_by: dict[tuple[str, int], str]) -> str:
    """Each MIG-capable GPU's memory-slice map: which slices its GPU instances cover, and their claims."""
    lines = []
    for gpu in inventory.gpus:
        if not gpu.info.mig_capable:
            continue
        cells = [
            InstanceCell(d.existing.gpu_instance_id, d.profile.name, d.placement.start, d.placement.size)
            for d in inventory.mig_devices
            if d.parent.name == gpu.name and d.existing is not None
        ]
        lines += ["", f"{gpu.name} (MIG {'enabled' if gpu.mig_enabled else 'disabled'})"]
        lines += ["  " + line for line in slice_map.render(gpu.uuid, cells, owned_by)]
    return "\n".join(lines) + "\n" if lines else ""


def _state_dir(args: argparse.Namespace, plugin_dir: Path) -> Path:
    """The running driver's state directory: ``--state-dir``, else its default, the plugin directory."""
    return Path(args.state_dir) if args.state_dir else plugin_dir


def load_inventory(args: argparse.Namespace) -> Inventory:
    """Discover the devices the GPU flags point at (shared by every subcommand that takes them)."""
    state = Path(args.sim_state) if args.sim_state else None
    if state is not None and not path_exists(state):
        state = None  # listing devices must not create the state file: the profile's initial state it is
    gpulib, _ = open_gpu_backend(
        args.gpu_backend, sim_profile=args.sim_profile, sim_state=state, node_name=args.node_name
    )
    try:
        return discover(gpulib)
    finally:
        gpulib.close()


def inventory_document(
    inventory: Inventory, mode: MigMode, *, node: str, health: GpuHealth | None = None
) -> dict[str, Any]:
    offered = inventory.devices(mode)
    lost = health.lost_gpus(inventory) if health is not None else list(inventory.lost_gpus)
    document: dict[str, Any] = {
        "node": node,
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
        "migMode": mode.value,
        "gpus": [_gpu_document(gpu, inventory) for gpu in inventory.gpus],
        "offeredDevices": [device.name for device in offered],
        "lostGpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "reason": g.reason} for g in lost],
    }
    if health is not None:
        names = [d.name for d in offered] + [g.name for g in lost if g.name]
        document["deviceHealth"] = {name: health.report(name) for name in names}
    return document


def _gpu_document(gpu: GpuDevice, inventory: Inventory) -> dict[str, Any]:
    info = gpu.info
    return {
        "name": gpu.name,
        "uuid": info.uuid,
        "productName": info.product_name,
        "brand": info.brand,
        "architecture": info.architecture,
        "cudaComputeCapability": "{}.{}".format(*info.cuda_compute_capability),
        "memoryBytes": info.memory_bytes,
        "multiprocessors": info.multiprocessors,
        "pciBusId": info.pci_bus_id,
        "pcieRoot": info.pcie_root,
        "numaNode": info.numa_node,
        "minor": info.minor,
        "nvlinkDomain": gpu.nvlink_domain,
        "migCapable": info.mig_capable,
        "migEnabled": gpu.mig_enabled,
        "migProfiles": [_profile_document(p) for p in gpu.mig_profiles],
        "migDevices": [
            {
                "name": d.name,
                "uuid": d.uuid,
                "profile": d.profile.name,
                "placementStart": d.placement.start,
                "gpuInstanceId": d.existing.gpu_instance_id if d.existing else None,
                "computeInstanceId": d.existing.compute_instance_id if d.existing else None,
            }
            for d in inventory.mig_devices
            if d.parent.name == gpu.name
        ],
    }


def _profile_document(profile: MigProfile) -> dict[str, Any]:
    return {
        "name": profile.name,
        "id": profile.id,
        "sliceCount": profile.slice_count,
        "memorySlices": profile.memory_slices,
        "maxInstances": profile.max_instances,
        "memoryMiB": profile.memory_mib,
        "multiprocessors": profile.multiprocessors,
        "copyEngines": profile.copy_engines,
        "decoders": profile.decoders,
        "encoders": profile.encoders,
        "jpegEngines": profile.jpeg_engines,
        "ofaEngines": profile.ofa_engines,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
    }


def _health_cells(health: GpuHealth | None, name: str) -> tuple[str, ...]:
    if health is None:
        return ()
    status, _ = health.status(name)
    taints = ",".join(
        f"{t['key'].rsplit('/', 1)[-1]}{'=' + t['value'] if t['value'] else ''}:{t['effect']}"
        for t in health.taints(name)
    )
    return (status.name.lower(), taints or "-")


def render_table(inventory: Inventory, mode: MigMode, health: GpuHealth | None = None) -> str:
    """The inventory as a table; with ``health``, each device's health and taints too, and lost GPUs."""
    offered = inventory.devices(mode)
    offered_names = {d.name for d in offered}
    header: tuple[str, ...] = ("NAME", "PRODUCT", "MEMORY", "NUMA", "NVLINK DOMAIN", "MIG", "OFFERED")
    rows = [header + (("HEALTH", "TAINTS") if health is not None else ())]
    for gpu in inventory.gpus:
        info = gpu.info
        mig = "enabled" if gpu.mig_enabled else "disabled" if info.mig_capable else "-"
        rows.append(
            (
                gpu.name,
                info.product_name,
                f"{info.memory_bytes / 2**30:.1f}Gi",
                "-" if info.numa_node is None else str(info.numa_node),
                gpu.nvlink_domain,
                mig,
                "yes" if gpu.name in offered_names else "no",
                *_health_cells(health, gpu.name),
            )
        )
        for device in (
            d for d in offered if isinstance(d, MigPartition) and d.parent.name == gpu.name and d.existing is not None
        ):
            rows.append(
                (
                    f"  {device.name}",
                    f"MIG {device.profile.name}",
                    f"{device.profile.memory_mib / 1024:.1f}Gi",
                    "",
                    "",
                    device.uuid or "",
                    "yes",
                    *_health_cells(health, device.name),
                )
            )
    lost_gpus = health.lost_gpus(inventory) if health is not None else list(inventory.lost_gpus)
    if health is not None:
        for lost in lost_gpus:
            name = lost.name or f"(GPU index {lost.index})"
            rows.append((name, "-", "-", "-", "-", "-", "no", "lost", *_health_cells(health, name)[1:]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    partitions = sum(1 for d in offered if isinstance(d, MigPartition) and d.existing is None)
    summary = (
        f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, MIG mode {mode.value}: "
        f"{len(offered)} devices offered"
    )
    if partitions:
        summary += f" ({partitions} of them MIG partitions that do not exist yet; -o json lists them)"
    notes = [f"lost: {lost.name or f'GPU index {lost.index}'}: {lost.reason}" for lost in lost_gpus]
    if health is not None:
        for name in sorted(offered_names):
            status, message = health.status(name)
            if message and status.name != "HEALTHY" and isinstance(_find(offered, name), GpuDevice):
                notes.append(f"{status.name.lower()}: {name}: {message}")
    return "\n".join([*lines, "", summary, *notes]) + "\n"


def _find(devices: list[GpuDevice | MigPartition], name: str) -> GpuDevice | MigPartition | None:
    return next((d for d in devices if d.name == name), None)
