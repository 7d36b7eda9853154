"""What the node tells about multi-node NVLink: its clique (from NVML's fabric info), the IMEX devices'
numbers (from ``/proc``) and whether its GPU driver's IMEX finds peers by name. The readers of ``/proc`` take the
root they read under, so the simulator can give a fake one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dradriver.errors import DeviceError
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.models import FabricState

CHANNELS_DEVICE = "nvidia-caps-imex-channels"
CAPS_DEVICE = "nvidia-caps"
IMEX_MGMT_CAPABILITY = "driver/nvidia/capabilities/fabric-imex-mgmt"
#: The oldest GPU driver whose IMEX daemon finds its peers by DNS name, as a driver-managed domain's daemons do
#: (NVIDIA's IMEXDaemonsWithDNSNamesMinDriverVersion: its plugin refuses to start below it).
IMEX_DNS_NAMES_MIN_DRIVER = "570.158.01"
_IMEX_DNS_NAMES_MIN_NUMBERS = (570, 158, 1)  # compared as NVIDIA's version.ParseGeneric does: 01 is 1


def old_driver_problem(driver_version: str) -> str:
    """Why a node with GPU driver ``driver_version`` cannot run driver-managed IMEX daemons; "" when it can (or
    when the version is not numbers and dots, which NVML never reports)."""
    found = _version_numbers(driver_version)
    if found is None or found >= _IMEX_DNS_NAMES_MIN_NUMBERS:
        return ""
    return (
        f"GPU driver {driver_version} is older than {IMEX_DNS_NAMES_MIN_DRIVER}, the first whose IMEX daemon finds "
        "its peers by DNS name, as driver-managed ComputeDomains' daemons do: upgrade the node's GPU driver to "
        f"{IMEX_DNS_NAMES_MIN_DRIVER} or newer, or run the node's own nvidia-imex service and serve domains from it "
        "with --imex-mode hostManaged (the chart's computeDomains.imex.mode), which works on older drivers"
    )


def _version_numbers(version: str) -> tuple[int, ...] | None:
    match = re.fullmatch(r"\d+(\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else None


def clique_id(gpulib: GpuLib) -> str:
    """``"<clusterUuid>.<cliqueId>"`` of this node's GPUs, or ``""`` for a node outside any multi-node clique.

    Strict, as NVIDIA's driver is by default: a GPU still registering with the fabric, or whose registration
    failed, is an error (a silent "no clique" would hide a fabric fault and split the job); GPUs that disagree
    are an error. No fabric info (before Hopper, no NVSwitch) and the all-zero cluster UUID mean no clique.
    """
    found: set[str] = set()
    for gpu in gpulib.gpus():
        info = gpulib.fabric_info(gpu.uuid, fresh=True)
        if info is None or info.state == FabricState.NOT_SUPPORTED:
            continue
        if info.state != FabricState.COMPLETED:
            raise DeviceError(
                f"GPU {gpu.uuid}: NVLink fabric registration is {FabricState(info.state).name}, not COMPLETED; "
                "wait for the fabric manager (nvidia-smi -q shows 'Fabric'), ComputeDomains start once it is done"
            )
        if info.status != 0:
            raise DeviceError(
                f"GPU {gpu.uuid}: NVLink fabric registration failed with NVML status {info.status}; "
                "check the fabric manager and the NVSwitches (nvidia-smi -q, section 'Fabric')"
            )
        found.add(f"{info.cluster_uuid}.{info.clique_id}" if info.multi_node else "")
    if len(found) > 1:
        raise DeviceError(f"this node's GPUs are in different NVLink cliques {sorted(found)}; one node, one clique")
    return found.pop() if found else ""


def device_major(name: str, proc_root: Path = Path("/proc")) -> int:
    """The major number of character device ``name`` in ``<proc_root>/devices``."""
    path = proc_root / "devices"
    try:
        text = path.read_text()
    except OSError as err:
        raise DeviceError(f"cannot read {path}: {err.strerror}") from None
    section = text.split("Character devices:", 1)[-1].split("Block devices:", 1)[0]
    for line in section.splitlines():
        match = re.fullmatch(r"\s*(\d+)\s+(\S+)\s*", line)
        if match and match.group(2) == name:
            return int(match.group(1))
    raise DeviceError(
        f"{path} lists no character device {name!r}: is the NVIDIA kernel driver (with IMEX channels, 535+) loaded?"
    )


@dataclass(frozen=True)
class CharDevice:
    """A character device the container gets: the runtime creates the node from these numbers."""

    path: str
    major: int
    minor: int
    mode: int = 0o666


def imex_mgmt_device(proc_root: Path = Path("/proc")) -> CharDevice:
    """The fabric-imex-mgmt capability device the IMEX daemon needs (``/dev/nvidia-caps/nvidia-cap<minor>``)."""
    path = proc_root / IMEX_MGMT_CAPABILITY
    try:
        fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
        minor = int(fields["DeviceFileMinor"].strip())
        mode = int(fields.get("DeviceFileMode", "256").strip())
    except (OSError, KeyError, ValueError) as err:
        raise DeviceError(f"cannot read the IMEX management capability from {path}: {err}") from None
    return CharDevice(f"/dev/nvidia-caps/nvidia-cap{minor}", device_major(CAPS_DEVICE, proc_root), minor, mode)
