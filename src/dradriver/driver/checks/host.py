"""The node itself: NVML (from where it loads), the driver and CUDA versions, then, with NVML open, the driver's
files (:mod:`.driver_files`), device nodes and MIG capabilities, persistence mode and the NVLink fabric; and the
directories the driver and the runtime share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from dradriver.driver.checks.driver_files import ROOT_FIX, driver_root_checks, libcuda_without_nvml
from dradriver.driver.checks.result import FAIL, OK, SKIP, WARN, CheckResult
from dradriver.driver.checks.settings import HostSettings
from dradriver.errors import DradriverError
from dradriver.gpu.backend import open_gpu_backend
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import Inventory, discover
from dradriver.nvidia_install.driver_root import DriverRoot


def gpu_checks(settings: HostSettings) -> Iterator[CheckResult]:
    """NVML, then what needs it open: the driver's version and files, device nodes, persistence mode and the
    fabric (only libcuda where NVML does not load). NVML is closed when the checks end."""
    gpulib, inventory, nvml = open_nvml(settings)
    yield nvml
    if gpulib is None or inventory is None:
        yield libcuda_without_nvml(settings)
        return
    try:
        yield driver_version_check(inventory)
        root, root_checks = driver_root_checks(settings, inventory.driver_version)
        yield from root_checks
        yield from device_node_checks(settings, inventory)
        yield persistence_check(root)
        yield fabric_check(gpulib, inventory)
    finally:
        gpulib.close()


def open_nvml(settings: HostSettings) -> tuple[GpuLib | None, Inventory | None, CheckResult]:
    """NVML opened and its GPUs discovered, with the check saying from where it loaded (a WARN when only the
    loader found it); both None, and a FAIL, where either step fails."""
    library = settings.nvml_library
    try:
        gpulib, simulated = open_gpu_backend(
            settings.gpu_backend, sim_profile=settings.sim_profile, sim_state=settings.sim_state, nvml_library=library
        )
    except DradriverError as err:
        return None, None, CheckResult("NVML", FAIL, str(err), ROOT_FIX)
    where = (
        f"simulated node {settings.sim_profile}"
        if simulated is not None
        else f"loaded from {library}"
        if library
        else "loaded by soname through this process's loader (not found in the driver root)"
    )
    try:
        inventory = discover(gpulib)
    except DradriverError as err:
        gpulib.close()
        return None, None, CheckResult("NVML", FAIL, f"{where}; discovery failed: {err}", "see the NVML error above")
    return gpulib, inventory, CheckResult("NVML", OK if simulated is not None or library else WARN, where)


def driver_version_check(inventory: Inventory) -> CheckResult:
    return CheckResult(
        "driver version",
        OK,
        f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, "
        f"{len(inventory.gpus)} GPU(s), {len(inventory.mig_devices)} MIG device(s)",
    )


def device_node_checks(settings: HostSettings, inventory: Inventory) -> Iterator[CheckResult]:
    """The control node and each GPU's node (a FAIL when one is missing), nvidia-uvm (a WARN) and, with a
    MIG-capable GPU, the capabilities MIG devices are opened through."""
    if settings.simulated:
        yield CheckResult("device nodes", SKIP, "simulated node: specs bind /dev/null")
        return
    dev = settings.dev_dir
    needed = ["nvidiactl", *(f"nvidia{gpu.info.minor}" for gpu in inventory.gpus)]
    missing = [name for name in needed if not (dev / name).exists()]
    if missing:
        yield CheckResult(
            "device nodes",
            FAIL,
            f"missing {', '.join('/dev/' + m for m in missing)}",
            "load the nvidia kernel module and create the nodes (nvidia-modprobe, or nvidia-smi once as root)",
        )
    else:
        uvm = (dev / "nvidia-uvm").exists()
        yield CheckResult(
            "device nodes",
            OK if uvm else WARN,
            f"{len(needed)} present" + ("" if uvm else "; /dev/nvidia-uvm missing"),
            "" if uvm else "load nvidia-uvm (nvidia-modprobe -u -c=0): CUDA needs it",
        )
    if any(gpu.info.mig_capable for gpu in inventory.gpus):
        yield mig_capabilities_check(settings.mig_capabilities)


def mig_capabilities_check(caps: Path) -> CheckResult:
    if caps.is_dir():
        return CheckResult("MIG capabilities", OK, f"{caps} readable; specs create /dev/nvidia-caps nodes")
    return CheckResult("MIG capabilities", FAIL, f"{caps} missing", "mount the host's /proc (MIG devices need it)")


def persistence_check(root: DriverRoot | None) -> CheckResult:
    """Whether nvidia-persistenced runs (its socket in the driver root); a WARN where it does not."""
    if root is None:
        return CheckResult("persistence mode", SKIP, "no driver root")
    if any(f.path.parts[-2:] == ("nvidia-persistenced", "socket") for f in root.sockets):
        return CheckResult("persistence mode", OK, "nvidia-persistenced is running")
    return CheckResult(
        "persistence mode",
        WARN,
        "nvidia-persistenced is not running",
        "enable nvidia-persistenced: without it every container start initialises the GPU again",
    )


def fabric_check(gpulib: GpuLib, inventory: Inventory) -> CheckResult:
    """On NVSwitch systems, whether every GPU registered with the NVLink fabric (the fabric manager runs)."""
    if not inventory.gpus:
        return CheckResult("fabric manager", SKIP, "no GPUs")
    registered = []
    for gpu in inventory.gpus:
        try:
            registered.append(gpulib.probe(gpu.uuid).fabric_registered)
        except DradriverError:
            continue
    if all(state is None for state in registered):
        return CheckResult("fabric manager", OK, "no NVSwitch fabric")
    if all(registered):
        return CheckResult("fabric manager", OK, "every GPU registered with the NVLink fabric")
    return CheckResult(
        "fabric manager",
        FAIL,
        f"{registered.count(False)} GPU(s) not registered with the NVLink fabric",
        "start nvidia-fabricmanager (the same version as the driver): NVSwitch systems need it for CUDA",
    )


def writable_dir(name: str, path: Path, flag: str, why: str) -> CheckResult:
    """Whether ``path`` is a directory this process may create files in; the fix names ``flag`` and ``why``."""
    if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
        return CheckResult(name, OK, f"{path} writable")
    state = "not writable" if path.is_dir() else "missing"
    return CheckResult(name, FAIL, f"{path} {state}", f"create {path} or mount the host's ({flag}): {why}")
