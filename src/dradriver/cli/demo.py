"""``dradriver demo``: the whole driver on a simulated node, no cluster needed.

It runs the real pieces end to end, each for real except the API server (an in-memory one) and the scheduler
(our allocator): discover GPUs, publish ResourceSlices, allocate a claim, register with a kubelet-like client over
the real gRPC sockets, prepare (CDI spec written), unprepare (CDI spec removed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.allocator import AllocationError, Unsatisfiable, allocate
from dradriver.cli.demo_input import Classes, default_claim, load_claim, load_classes
from dradriver.cli.flags.gpus import GPU_BACKEND, MIG_MODE, SIM_PROFILE, SIM_STATE, GpuOptions
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.flags.publishing import COMPAT
from dradriver.cli.flags.sharing import CONSUMABLE_SHARES, GPU_SHARING, SharingOptions
from dradriver.cli.inventory import render_table
from dradriver.driver.prepare.mps import DEFAULT_COMMAND, MpsControl
from dradriver.driver.prepare.presets import PRESETS
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
from dradriver.gpu.backend import simulated_driver_root, simulated_mps_command
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import Inventory, MigMode, MigPartition, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.driver_root import discover_driver_root
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Discover a simulated node, publish its ResourceSlices to an in-memory API server, allocate a "
        "claim, then register with a kubelet-like client over real gRPC sockets, prepare the claim "
        "(printing its CDI spec) and unprepare it."
    )
    _add_node_flags(parser)
    _add_claim_flags(parser)
    parser.set_defaults(handler=run)


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    """The node: where its GPUs come from, how they are published, under whose names."""
    group = parser.add_argument_group("the node (the defaults are the Helm chart's, on a simulated node)")
    # The backend and the state file are the command line's only: in a driver's pod, DRADRIVER_GPU_BACKEND and
    # DRADRIVER_SIM_STATE name the node the running driver serves, which a demo must not prepare devices on.
    GPU_BACKEND.add(
        group,
        default="sim",
        from_env=False,
        help="where GPUs come from: a simulated node, or this machine's GPUs through NVML (prepared for real)",
    )
    SIM_PROFILE.add(group)
    SIM_STATE.add(
        group,
        from_env=False,
        help="JSON file holding the simulated node's hardware state (MIG mode, MIG devices, compute modes) across "
        "runs, shared with `dradriver sim` and `dradriver run` (use the same --node-name); MIG devices already "
        "there are left alone; in memory when unset",
    )
    MIG_MODE.add(group)
    NODE_NAME.add(group, default="demo-node", help="the node's name (a simulated node's GPU UUIDs derive from it)")
    COMPAT.add(
        group,
        help="run under another driver's names: 'nvidia' publishes as gpu.nvidia.com with NVIDIA's DeviceClasses "
        "gpu.nvidia.com and mig.nvidia.com, so claims written for NVIDIA's driver demo unedited",
    )
    GPU_SHARING.add(group, help="whole GPUs for one claim each, or as consumable capacity (chart value gpu.sharing)")
    CONSUMABLE_SHARES.add(group, help="NVIDIA's consumable shares (chart value gpu.consumableShares)")


def _add_claim_flags(parser: argparse.ArgumentParser) -> None:
    """The claim, the DeviceClasses it names, and how much of what prepare wrote is printed."""
    group = parser.add_argument_group("the claim")
    group.add_argument(
        "--claim",
        metavar="FILE",
        help="a file whose first ResourceClaim or ResourceClaimTemplate (YAML) is allocated and prepared, or "
        "without one, the claim the scheduler makes for its first Pod asking for a DeviceClass's extended resource "
        "(nvidia.com/gpu: 1); other objects are skipped (default: two GPUs on one NVLink domain)",
    )
    group.add_argument(
        "--classes",
        action="append",
        default=[],
        metavar="FILE|DIR",
        help="DeviceClasses the claim may name (default: those the Helm chart installs, with --compat's names); "
        "DeviceClasses in the --claim file are added",
    )
    group.add_argument(
        "--full", action="store_true", help="print the whole CDI spec and claim status (default: a summary of each)"
    )


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """The node (its GPUs, name and driver name, how it shares GPUs), the DeviceClasses, and whether to print
    prepare's output whole."""

    node: str
    gpus: GpuOptions
    sharing: SharingOptions
    driver_name: str
    gpu_class: str
    classes: Classes
    full: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DemoOptions:
        """Read and check the flags: the state file can be written, the shares are valid, the classes load."""
        gpus, sharing = GpuOptions.from_args(args), SharingOptions.from_args(args)
        gpus.check()
        sharing.check()
        compat = COMPAT.value(args)
        preset = PRESETS.get(compat)
        return cls(
            node=NODE_NAME.value(args),
            gpus=gpus,
            sharing=sharing,
            driver_name=preset.driver_name if preset else DEFAULT_DRIVER_NAME,
            gpu_class=preset.gpu_class if preset else DEFAULT_DRIVER_NAME,
            classes=load_classes(args.classes, compat),
            full=args.full,
        )

    @property
    def node_in_memory(self) -> bool:
        """Whether the node lives in memory for this demo only (simulated, no --sim-state): the only node whose MIG
        devices the demo may destroy, since no one else can hold them."""
        return self.gpus.backend == "sim" and self.gpus.sim_state is None


def run(args: argparse.Namespace) -> int:
    options = DemoOptions.from_args(args)
    if args.claim:
        loaded = load_claim(args.claim, options.classes, driver_name=options.driver_name)
        claim, source, options = loaded.claim, loaded.source, replace(options, classes=loaded.classes)
    else:
        claim = default_claim(options.driver_name, options.gpu_class)
        source = "the built-in example (--claim FILE for yours)"
    gpulib, _ = options.gpus.open_backend(node_name=options.node)
    root = Path(tempfile.mkdtemp(prefix="dradriver-demo-", dir="/tmp"))
    try:
        with _driver_warnings_quiet():
            return _demo(root, claim, source, gpulib=gpulib, options=options)
    finally:
        gpulib.close()
        shutil.rmtree(root, ignore_errors=True)


#: Loggers quieted while the demo runs, and down to which level: the driver's warnings are told by the demo itself
#: (a failed prepare, the MIG devices destroyed at start); MPS's error that its shm mount does not reach the host
#: is about a node's containers, which a demo has none of.
QUIETED = {"dradriver": logging.ERROR, "dradriver.driver.prepare.mps": logging.CRITICAL}


@contextlib.contextmanager
def _driver_warnings_quiet() -> Iterator[None]:
    """The loggers of :data:`QUIETED` at their levels while the demo runs, as they were after."""
    loggers = {logging.getLogger(name): level for name, level in QUIETED.items()}
    before = {logger: logger.level for logger in loggers}
    for logger, level in loggers.items():
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, level in before.items():
            logger.setLevel(level)


def _demo(root: Path, claim: dict[str, Any], source: str, *, gpulib: GpuLib, options: DemoOptions) -> int:
    """The six steps, the driver's files in ``root``."""
    driver = _start_driver(root, gpulib, options)
    cluster = MemoryCluster()
    slices = _publish(cluster, driver.inventory, options)
    if slices is None:
        return 1
    metadata = claim["metadata"]
    _step(f"3. Allocated claim {metadata['namespace']}/{metadata['name']} from {source} as the scheduler would")
    stored = _allocate(cluster, claim, slices, options)
    if stored is None:
        return 1
    return _prepare_and_unprepare(root, driver=driver, cluster=cluster, claim=stored, options=options)


@dataclass(frozen=True)
class StartedDriver:
    """The GPU driver as ``dradriver run`` starts it, the node's GPUs as it found them, and its CDI writer."""

    driver: GpuDriver
    inventory: Inventory
    cdi: CdiWriter


def _start_driver(root: Path, gpulib: GpuLib, options: DemoOptions) -> StartedDriver:
    """Step 1: discover the GPUs and start the GPU driver on them. A node in memory is reconciled as ``dradriver
    run`` reconciles at start (in dynamic mode, the MIG devices no claim owns are destroyed, so the whole GPU can be
    offered); any other node's MIG devices may be another driver's, and are left alone."""
    inventory, gpus = discover(gpulib), options.gpus
    cdi = CdiWriter(
        root / "cdi",
        host_path=lambda _path: "/dev/null",
        driver_root=discover_driver_root(
            host_root=str(simulated_driver_root(root / "driver-root", inventory.driver_version)),
            version=inventory.driver_version,
        ),
    )
    driver = GpuDriver(
        GpuDriverOptions(
            driver_name=options.driver_name,
            pool=options.node,
            mig_mode=gpus.mig_mode,
            consumable_shares=options.sharing.consumable_shares,
        ),
        inventory=inventory,
        cdi=cdi,
        gpulib=gpulib,
        mps=MpsControl(simulated_mps_command() if gpus.backend == "sim" else list(DEFAULT_COMMAND), root / "mps"),
    )
    destroyed = 0
    if options.node_in_memory:
        driver.reconcile()
        if gpus.mig_mode is MigMode.DYNAMIC:
            before, inventory = len(inventory.mig_devices), discover(gpulib)
            destroyed = before - len(inventory.mig_devices)
            driver.update_inventory(inventory, gpus.mig_mode)
    where = f"simulated: {gpus.sim_profile}" if gpus.backend == "sim" else "NVML: this machine's GPUs"
    where += f", state in {gpus.sim_state}" if gpus.sim_state and gpus.backend == "sim" else ""
    _step(f"1. Discovered node {options.node} ({where})")
    if destroyed:
        print(f"dynamic MIG: destroyed {destroyed} MIG devices no claim owns, as the driver does when it starts")
    elif gpus.mig_mode is MigMode.DYNAMIC and inventory.mig_devices:
        count = len(inventory.mig_devices)
        print(
            f"dynamic MIG: {count} MIG device{'s' if count != 1 else ''} already there, left alone "
            "(they may be another driver's; a node in memory, without --sim-state, starts clean)"
        )
    print(render_table(inventory, gpus.mig_mode), end="")
    return StartedDriver(driver, inventory, cdi)


def devices_in_the_way(inventory: Inventory, mode: MigMode, allocated: list[str]) -> list[MigPartition]:
    """The MIG devices already on the GPUs of the ``allocated`` devices: in dynamic mode, what a prepare that
    switches a GPU's MIG mode or carves a partition can fail on, when the demo left them alone."""
    if mode is not MigMode.DYNAMIC:
        return []
    parents = {d.name: (d.parent if isinstance(d, MigPartition) else d).name for d in inventory.devices(mode)}
    wanted = {parents[name] for name in allocated if name in parents}
    return [d for d in inventory.mig_devices if d.parent.name in wanted]


def _publish(cluster: MemoryCluster, inventory: Inventory, options: DemoOptions) -> list[dict[str, Any]] | None:
    """Step 2: the node's slices, published through the real publisher; None when they break the server's rules."""
    node, driver = options.node, options.driver_name
    cluster.add_node(node)
    settings = SliceSettings(
        driver=driver,
        mig_mode=options.gpus.mig_mode,
        gpu_sharing=options.sharing.gpu_sharing,
        consumable_shares=options.sharing.consumable_shares,
    )
    specs = build_slice_specs(inventory, settings)
    publisher = Publisher(
        cluster,
        PublisherOptions(driver=driver, node_name=node, node_uid=cluster.get_node(node)["metadata"]["uid"]),
        pools={node: [SliceSpec.of(s.get("devices", ()), s.get("sharedCounters", ())) for s in specs]},
    )
    publisher.reconcile()
    _step("2. Published ResourceSlices to the (in-memory) API server")
    invalid = publisher.status.invalid_pools
    if invalid:
        print(f"the slices break the API server's rules, nothing was published: {invalid}")
        return None
    slices = cluster.slice_objects()
    devices = sum(len(s["spec"].get("devices", [])) for s in slices)
    print(
        f"{len(slices)} slice{'s' if len(slices) != 1 else ''}, {devices} devices, pool {node} generation "
        f"{slices[0]['spec']['pool']['generation']}; every slice passed the API server's validation rules"
    )
    return slices


def _allocate(
    cluster: MemoryCluster, claim: dict[str, Any], slices: list[dict[str, Any]], options: DemoOptions
) -> dict[str, Any] | None:
    """Step 3: the claim allocated by our allocator and stored with its allocation; None when it does not fit."""
    print(f"DeviceClasses: {options.classes.origin}")
    try:
        allocation = allocate(claim, slices=slices, classes=options.classes.objects, node=options.node)
    except (Unsatisfiable, AllocationError) as err:
        print(f"the claim does not fit this node: {err}\n(try `dradriver explain` for the details)")
        return None
    claim["status"] = {"allocation": allocation}
    stored = cluster.add_resource_claim(claim)
    for entry in allocation["devices"]["results"]:
        print(f"request {entry['request']}: {entry['device']}")
    return stored


def _prepare_and_unprepare(
    root: Path, *, driver: StartedDriver, cluster: MemoryCluster, claim: dict[str, Any], options: DemoOptions
) -> int:
    """Steps 4 to 6: register, prepare (CDI spec and claim status printed), unprepare."""
    node, driver_name = options.node, options.driver_name
    claim_status = ClaimStatusWriter(cluster, driver_name=driver_name, node_name=node)
    plugin = KubeletPlugin(
        KubeletPluginOptions(
            driver_name=driver_name, node_name=node, registry_dir=root / "registry", plugin_dir=root / "plugin"
        ),
        handler=driver.driver,
        claim_source=cluster,
        claim_status=claim_status,
    )
    ref = Claim(claim["metadata"]["namespace"], claim["metadata"]["name"], claim["metadata"]["uid"])
    with plugin, KubeletClient(root / "registry").register() as kubelet:
        _step("4. Registered with the kubelet over gRPC")
        print(f"plugin {kubelet.info.name}, endpoint {kubelet.info.endpoint}, the kubelet chose {kubelet.version}")

        prepared = kubelet.prepare([ref])[ref.uid]
        _step("5. NodePrepareResources")
        if prepared.error:
            print(f"prepare failed: {prepared.error}")
            _say_what_is_in_the_way(driver.inventory, claim, options)
            return 1
        for device in prepared.devices:
            print(f"{device['device_name']}: {', '.join(device['cdi_device_ids'])}")
        spec_path = driver.cdi.spec_path(ref.uid)
        _print_spec(spec_path, ref.uid, full=options.full)
        claim_status.wait_idle(10)
        stored = cluster.get_resource_claim(ref.namespace, ref.name)
        _print_status(stored.get("status", {}).get("devices", []), full=options.full)

        errors = kubelet.unprepare([ref])
        _step("6. NodeUnprepareResources")
        print(errors[ref.uid] or f"done; CDI spec removed: {not spec_path.exists()}")
    return 0


def _say_what_is_in_the_way(inventory: Inventory, claim: dict[str, Any], options: DemoOptions) -> None:
    """After a failed prepare: the MIG devices the demo left alone on the claim's GPUs, and how to clear them."""
    results = claim["status"]["allocation"]["devices"]["results"]
    found = devices_in_the_way(inventory, options.gpus.mig_mode, [str(entry["device"]) for entry in results])
    if not found:
        return
    print(f"in the way: MIG devices the demo did not make, left alone: {', '.join(d.name for d in found)}")
    if options.gpus.backend != "sim":
        print("destroy them (nvidia-smi mig -dci, then -dgi) if no one uses them")
        return
    sim = f"dradriver sim --sim-state {options.gpus.sim_state} --node-name {options.node}"
    commands = "; ".join(
        f"{sim} mig-destroy {d.parent.info.pci_bus_id} {d.existing.gpu_instance_id}" for d in found if d.existing
    )
    print(f"destroy them ({commands}) if no one uses them, or demo without --sim-state")


def _print_spec(path: Path, claim_uid: str, *, full: bool) -> None:
    """The claim's CDI spec: whole and indented with ``full`` (the driver writes it on one line: the C encoder is
    faster), else its kind and devices with what each adds to a container."""
    spec = json.loads(path.read_text())
    print(f"CDI spec {path.name}:")
    if full:
        print(json.dumps(spec, indent=2))
        return
    devices = [d for d in spec.get("devices") or () if isinstance(d, dict)]
    counted = f"{len(devices)} device{'s' if len(devices) != 1 else ''}"
    print(f"  kind {spec.get('kind')}, cdiVersion {spec.get('cdiVersion')}, {counted}")
    for device in devices:
        name = str(device.get("name")).removeprefix(f"{claim_uid}-")  # each name starts with the claim's UID
        print(f"  device …-{name}: {edits_summary(device.get('containerEdits'))}")
    print(f"  every device: {edits_summary(spec.get('containerEdits'))}")
    print("  … (--full for the whole spec)")


def edits_summary(edits: Any) -> str:
    """What CDI container edits add, in one line: device nodes and env by name, mounts and hooks by count (with the
    first mount), anything else by its field name."""
    if not isinstance(edits, dict) or not edits:
        return "nothing"
    parts = []
    nodes = [str(n.get("path")) for n in edits.get("deviceNodes") or () if isinstance(n, dict)]
    if nodes:
        shown = f"device node{'s' if len(nodes) != 1 else ''} {', '.join(nodes)}"
        parts.append(shown if len(nodes) <= 2 else f"{len(nodes)} device nodes")
    mounts = [m for m in edits.get("mounts") or () if isinstance(m, dict)]
    if mounts:
        parts.append(f"{len(mounts)} mount{'s' if len(mounts) != 1 else ''} ({mounts[0].get('containerPath')}, …)")
    hooks = [h for h in edits.get("hooks") or () if isinstance(h, dict)]
    if hooks:
        parts.append(f"{len(hooks)} hook{'s' if len(hooks) != 1 else ''}")
    env = [str(value) for value in edits.get("env") or ()]
    if env:
        parts.append(f"env {', '.join(env)}")
    parts += [key for key in edits if key not in ("deviceNodes", "mounts", "hooks", "env")]
    return "; ".join(parts)


def _print_status(devices: list[dict[str, Any]], *, full: bool) -> None:
    """The claim's status.devices as the driver wrote them: whole with ``full``, else a line per device."""
    print("claim status.devices:")
    if full:
        print(json.dumps(devices, indent=2))
        return
    for device in devices:
        conditions = ", ".join(
            f"{c.get('type')}{'' if c.get('status') == 'True' else '=' + str(c.get('status'))} ({c.get('reason')})"
            for c in device.get("conditions") or ()
        )
        data = ", ".join(f"{key} {value}" for key, value in _flat(device.get("data") or {}))
        print(f"  {device.get('device')}: {conditions}; {data}")


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"sharing": {"strategy": "MPS"}}`` → ``[("sharing.strategy", "MPS")]``."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            pairs += _flat(value, f"{prefix}{key}.")
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


def _step(title: str) -> None:
    print(f"\n==> {title}", file=sys.stdout)
