"""``dradriver sim``: what nvidia-smi is to a real node, for a simulated one.

It acts on the simulated hardware state file that a running ``dradriver run --gpu-backend sim --sim-state FILE``
shares, so an admin (or a test) can carve MIG devices out of band, change modes, or break a GPU, and watch the
driver react: rediscovery republishes slices, health events reach the kubelet's health stream.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dradriver.cli.flags.gpus import SIM_PROFILE, SIM_STATE, unwritable_state
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.flags.values import check_writable_file
from dradriver.driver.publish import slice_map
from dradriver.driver.publish.slice_map import InstanceCell, owners_from_checkpoint
from dradriver.errors import ConfigError, DeviceError
from dradriver.gpu.models import ComputeMode, FabricState
from dradriver.gpu.products import LOST_XIDS
from dradriver.inputs import path_exists
from dradriver.sim.fabric_manager import SimFabricManager
from dradriver.sim.node import SimGpu, SimNvmlError, SimulatedNode, full_compute_instance_profile
from dradriver.sim.profiles import load_node_profile


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Act on the hardware state file of a simulated node, as an admin with nvidia-smi would on a "
        "real one. A running `dradriver run --gpu-backend sim` on the same --sim-state sees it."
    )
    SIM_PROFILE.add(parser, help="the simulated node's profile")
    SIM_STATE.add(parser, help="the hardware state file shared with the driver (required)")
    NODE_NAME.add(parser, default="sim-node", help="node name (the driver's --node-name: it seeds the GPU UUIDs)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    _add_hardware_actions(actions)
    _add_fault_actions(actions)
    _add_workload_actions(actions)
    _add_fabric_manager_action(actions)
    parser.set_defaults(handler=run, read_only=False)
    _add_imex_action(actions)


def _add_hardware_actions(actions: Any) -> None:
    """``show`` and what an admin changes: MIG mode, reset, MIG devices, compute mode."""
    show = actions.add_parser("show", help="print GPUs, MIG mode, compute mode, MIG devices and slice maps")
    show.add_argument("--state-dir", help="the driver's state directory: name the claim owning each MIG instance")
    show.set_defaults(sim_action=_show, read_only=True)

    mode = actions.add_parser("mig-mode", help="enable or disable MIG (Ampere: pending until `reset`)")
    mode.add_argument("gpu", help="PCI address (0000:0f:00.0) or index")
    mode.add_argument("state", choices=("enable", "disable"))
    mode.set_defaults(sim_action=_mig_mode)

    reset = actions.add_parser(
        "reset",
        help="reset a GPU, like nvidia-smi -r: applies a pending MIG mode, zeroes the volatile ECC counters, "
        "discards its unread events and brings a lost GPU back",
    )
    reset.add_argument("gpu")
    reset.set_defaults(sim_action=_reset)

    create = actions.add_parser("mig-create", help="create a GPU instance with its full compute instance")
    create.add_argument("gpu")
    create.add_argument("profile", help="MIG profile name, e.g. 1g.10gb")
    create.add_argument("--start", type=non_negative, help="memory slice to place it at (default: the first free one)")
    create.set_defaults(sim_action=_mig_create)

    destroy = actions.add_parser("mig-destroy", help="destroy a GPU instance and its compute instances")
    destroy.add_argument("gpu")
    destroy.add_argument("gpu_instance", type=non_negative, help="GPU instance id (see `show`)")
    destroy.set_defaults(sim_action=_mig_destroy)

    compute = actions.add_parser("compute-mode", help="set a GPU's compute mode")
    compute.add_argument("gpu")
    compute.add_argument("mode", choices=[m.name for m in ComputeMode])
    compute.set_defaults(sim_action=_compute_mode)


def _add_fault_actions(actions: Any) -> None:
    """What goes wrong on a real node: XIDs, ECC errors, the NVLink fabric's registration, a GPU off the bus."""
    xid = actions.add_parser("xid", help="raise an XID error on a GPU")
    xid.add_argument("gpu")
    xid.add_argument("xid", type=xid_number, help=f"XID number, {MIN_XID} to {MAX_XID}")
    xid.set_defaults(sim_action=_xid)

    ecc = actions.add_parser("ecc", help="raise double-bit (uncorrectable) ECC errors on a GPU")
    ecc.add_argument("gpu")
    ecc.add_argument("--count", type=int, default=1, help="how many errors the counters grow by (default: 1)")
    ecc.set_defaults(sim_action=_ecc)

    fabric = actions.add_parser(
        "fabric", help="set a GPU's NVLink fabric registration, as the fabric manager does while it (re)registers"
    )
    fabric.add_argument("gpu")
    fabric.add_argument("state", choices=[s.name for s in FabricState if s is not FabricState.NOT_SUPPORTED])
    fabric.add_argument("--status", type=int, default=0, help="NVML return code of a COMPLETED registration (0: ok)")
    fabric.set_defaults(sim_action=_fabric)

    lose = actions.add_parser("lose", help="make a GPU fall off the bus (GPU_IS_LOST until `reset`)")
    lose.add_argument("gpu")
    lose.add_argument(
        "--unattributable",
        action="store_true",
        help="NVML reports a lost GPU but every GPU still answers, so no call can say which",
    )
    lose.set_defaults(sim_action=_lose)


def _add_imex_action(actions: Any) -> None:
    """``imex``: the IMEX stand-in that the simulated driver root's nvidia-imex and nvidia-imex-ctl run (in a
    ComputeDomain daemon pod of our image); it needs no state file, so it has a handler of its own."""
    imex = actions.add_parser(
        "imex", help="run the IMEX stand-in, as the simulated driver's nvidia-imex (daemon) and nvidia-imex-ctl (ctl)"
    )
    imex.add_argument("tool", choices=("daemon", "ctl"))
    imex.add_argument("tool_args", nargs=argparse.REMAINDER, help="-c <cfg> [-q | -N]")
    imex.set_defaults(handler=_imex)


def _add_fabric_manager_action(actions: Any) -> None:
    """``partitions``: Fabric Manager's NVSwitch partitions on an HGX profile, as ``fmpm -l`` lists them; activate
    or deactivate one out of band (docs/partitions.md)."""
    partitions = actions.add_parser("partitions", help="list Fabric Manager's partitions; activate or deactivate one")
    change = partitions.add_mutually_exclusive_group()
    change.add_argument("--activate", type=int, metavar="ID", help="activate partition ID, as fmpm -a does")
    change.add_argument("--deactivate", type=int, metavar="ID", help="deactivate partition ID, as fmpm -d does")
    partitions.set_defaults(sim_action=_partitions)


def _add_workload_actions(actions: Any) -> None:
    """``process`` and ``process-end``: CUDA processes on the simulated node, for usage metrics and `top`."""
    process = actions.add_parser(
        "process", help="start a CUDA process on a GPU or MIG device (what NVML's process list and usage show)"
    )
    process.add_argument("device", help="a GPU (PCI address, index or UUID) or a MIG device's UUID (MIG-…)")
    process.add_argument("pid", type=positive, help="its PID (to map it to a pod, the PID of a pod's process)")
    process.add_argument("--memory-mib", type=non_negative, default=1024, help="device memory it holds (MiB)")
    process.add_argument("--utilization", type=percent, default=50, help="how busy it keeps the GPU (percent)")
    process.add_argument("--pod-uid", default="", help="the UID of the pod it runs in (its cgroup on a real node)")
    process.set_defaults(sim_action=_process)

    end = actions.add_parser("process-end", help="end a process started with `process`")
    end.add_argument("pid", type=positive)
    end.set_defaults(sim_action=_process_end)


# NVML reports XIDs as small positive numbers; the documented ones stay well below this bound.
MIN_XID, MAX_XID = 1, 999


def xid_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not MIN_XID <= value <= MAX_XID:
        raise argparse.ArgumentTypeError(f"XID {value} is out of range: use {MIN_XID} to {MAX_XID} (e.g. 79, 48)")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: use 1 or more")
    return value


def percent(text: str) -> int:
    value = non_negative(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"{value}: use a percentage, 0 to 100")
    return value


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; see `dradriver sim show` for valid values")
    return value


def _imex(args: argparse.Namespace) -> int:
    from dradriver.sim import imex_standin

    try:
        imex_standin.main([args.tool, *args.tool_args])
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # the stand-in's message, as the real tool prints it
            print(exit_.code, file=sys.stderr)
            return 1
        return exit_.code or 0
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.sim_state:
        raise ConfigError("--sim-state is required: the state file the simulated node's driver uses")
    state = Path(args.sim_state)
    check_writable_file("--sim-state", state)
    profile = load_node_profile(args.sim_profile)
    # Nothing is created before the values are known good, and reading creates nothing: without a state file,
    # the GPU is looked up (and `show` shows) the profile's initial state from memory.
    node = SimulatedNode(profile, node_name=args.node_name, state_path=state if path_exists(state) else None)
    if getattr(args, "gpu", None) is not None:
        _gpu(node, args.gpu)
    try:
        if node.state_path is None and not args.read_only:
            node = SimulatedNode(profile, node_name=args.node_name, state_path=state)
        args.sim_action(node, args)
    except SimNvmlError as err:
        raise DeviceError(f"simulated NVML refused: {err} (NVML error {err.code})") from err
    except BrokenPipeError:
        raise  # the reader of `show` went (`| head`): main's rule for a closed pipe, not a state-file error
    except OSError as err:
        raise unwritable_state(state, err) from None
    return 0


def _gpu(node: SimulatedNode, which: str) -> SimGpu:
    for gpu in node.gpus:
        if which in (gpu.pci_bus_id, str(gpu.index), gpu.uuid):
            return gpu
    known = ", ".join(g.pci_bus_id for g in node.gpus)
    raise ConfigError(f"no GPU {which!r} on this simulated node: use a PCI address ({known}), an index or a UUID")


def _show(node: SimulatedNode, args: argparse.Namespace) -> None:
    owned_by = owners_from_checkpoint(Path(args.state_dir) if args.state_dir else None)
    for gpu in node.gpus:
        mig = (
            "lost"
            if gpu.lost
            else ("enabled" if gpu.mig_current else "disabled")
            + (
                " (pending {})".format("enable" if gpu.mig_pending else "disable")
                if gpu.mig_pending != gpu.mig_current
                else ""
            )
        )
        print(
            f"{gpu.index}  {gpu.pci_bus_id}  {gpu.product_name}  {gpu.uuid}  MIG {mig}  "
            f"compute mode {ComputeMode(gpu.compute_mode).name}"
            + (f"  time-slice {gpu.timeslice}" if gpu.timeslice else "")
        )
        if gpu.lost:
            continue
        for gi, ci in node.mig_devices(gpu.index):
            print(
                f"     GI {gi.id:<2} {gi.profile.name:<11} slices {gi.placement.start}-"
                f"{gi.placement.start + gi.placement.size - 1}  CI {ci.id}  {ci.uuid}"
            )
        if gpu.product.mig_capable:
            cells = [
                InstanceCell(gi.id, gi.profile.name, gi.placement.start, gi.placement.size)
                for gi in gpu.gpu_instances.values()
            ]
            for line in slice_map.render(gpu.uuid, cells, owned_by):
                print(f"     {line}")


def _mig_mode(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    node.set_mig_mode(gpu.index, args.state == "enable")
    if gpu.mig_pending != gpu.mig_current:
        print(f"MIG mode change pending on {gpu.pci_bus_id}: `dradriver sim reset {gpu.pci_bus_id}` applies it")
    else:
        print(f"MIG {'enabled' if gpu.mig_current else 'disabled'} on {gpu.pci_bus_id}")


def _reset(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    was_lost = gpu.lost
    node.reset_gpu(gpu.index)
    back = " (back on the bus)" if was_lost else ""
    print(f"reset {gpu.pci_bus_id}{back}: MIG {'enabled' if gpu.mig_current else 'disabled'}")


def _mig_create(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    profile = next((p for p in gpu.mig_profiles() if p.name == args.profile), None)
    if profile is None:
        names = ", ".join(p.name for p in gpu.mig_profiles()) or "none: it has no MIG"
        raise ConfigError(f"{gpu.product_name} has no MIG profile {args.profile!r}; its profiles: {names}")
    gi = node.create_gpu_instance(gpu.index, profile.id, args.start)
    ci = node.create_compute_instance(gpu.index, gi.id, full_compute_instance_profile(profile.slice_count))
    print(
        f"created GPU instance {gi.id} ({profile.name} at slice {gi.placement.start}) with compute instance "
        f"{ci.id}: {ci.uuid}"
    )


def _mig_destroy(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    gi = node.gpu_instance(gpu.index, args.gpu_instance)
    for ci_id in list(gi.compute_instances):
        node.destroy_compute_instance(gpu.index, gi.id, ci_id)
    node.destroy_gpu_instance(gpu.index, gi.id)
    print(f"destroyed GPU instance {args.gpu_instance} on {gpu.pci_bus_id}")


def _compute_mode(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    node.set_compute_mode(gpu.index, ComputeMode[args.mode])
    print(f"compute mode of {gpu.pci_bus_id}: {args.mode}")


def _fabric(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    try:
        node.set_fabric_state(gpu.index, FabricState[args.state], args.status)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(f"fabric registration of {gpu.pci_bus_id}: {args.state} (status {args.status})")


def _partitions(node: SimulatedNode, args: argparse.Namespace) -> None:
    fabric_manager = SimFabricManager.beside(node)
    if args.activate is not None:
        fabric_manager.activate(args.activate)
    elif args.deactivate is not None:
        fabric_manager.deactivate(args.deactivate)
    print(f"{'ID':<4}{'GPUS':<7}{'ACTIVE':<8}MODULES")
    for partition in fabric_manager.supported_partitions():
        modules = ",".join(str(g.physical_id) for g in partition.gpus)
        print(f"{partition.id:<4}{partition.size:<7}{'yes' if partition.active else 'no':<8}{modules}")


def _xid(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    node.inject_xid(gpu.index, args.xid)
    lost = ": the GPU fell off the bus; NVML answers GPU_IS_LOST for it until `reset`" if args.xid in LOST_XIDS else ""
    print(f"XID {args.xid} raised on {gpu.pci_bus_id}{lost}")


def _ecc(node: SimulatedNode, args: argparse.Namespace) -> None:
    if not 1 <= args.count <= 1_000_000:
        raise ConfigError(f"--count {args.count}: the number of ECC errors must be 1..1000000")
    gpu = _gpu(node, args.gpu)
    node.inject_ecc(gpu.index, args.count)
    print(f"{args.count} double-bit ECC error(s) on {gpu.pci_bus_id}: {gpu.ecc_volatile} since the last reset")


def _lose(node: SimulatedNode, args: argparse.Namespace) -> None:
    gpu = _gpu(node, args.gpu)
    node.lose_gpu(gpu.index, attributable=not args.unattributable)
    if args.unattributable:
        print(f"{gpu.pci_bus_id} reported lost, but it still answers: NVML cannot say which GPU it was")
    else:
        print(f"{gpu.pci_bus_id} fell off the bus")


def _process(node: SimulatedNode, args: argparse.Namespace) -> None:
    uuid = args.device if args.device.startswith("MIG-") else _gpu(node, args.device).uuid
    node.start_process(uuid, args.pid, args.memory_mib << 20, args.utilization, pod_uid=args.pod_uid)
    print(f"process {args.pid} runs on {uuid}: {args.memory_mib} MiB, {args.utilization}% busy")


def _process_end(node: SimulatedNode, args: argparse.Namespace) -> None:
    node.end_process(args.pid)
    print(f"process {args.pid} ended")
