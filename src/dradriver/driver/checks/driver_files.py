"""NVIDIA's install under the driver root, as the CDI specs will use it: libcuda of the running version and how it
was found, each class of driver library, the binaries, the GSP firmware, and the CDI hook the specs call."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from dradriver.driver.checks.result import FAIL, OK, SKIP, WARN, CheckResult
from dradriver.driver.checks.settings import HostSettings
from dradriver.nvidia_install.cdi_hook import HOOK_NAME
from dradriver.nvidia_install.driver_root import (
    CDI_HOOK,
    FOUND_IN_CONF,
    KNOWN_ROOTS,
    DriverFilesMissing,
    DriverRoot,
    DriverRootError,
    discover_driver_root,
    find_library,
    likely_driver_roots,
)
from dradriver.nvidia_install.root_paths import regular_file

ROOT_FIX = (
    "install the NVIDIA driver, or point --driver-root (host path; /run/nvidia/driver with the GPU Operator, "
    "/home/kubernetes/bin/nvidia on GKE) and --container-driver-root (its mount here) at its root"
)
#: Library classes, by file-name prefix, the way an admin thinks of them.
LIBRARY_CLASSES = (
    ("CUDA", ("libcuda.", "libnvidia-ptxjitcompiler.", "libnvidia-nvvm", "libcudadebugger.")),
    ("NVML", ("libnvidia-ml.",)),
    ("video", ("libnvcuvid.", "libnvidia-encode.", "libvdpau_nvidia.", "libnvidia-opticalflow.")),
    ("graphics", ("libGLX_nvidia.", "libEGL_nvidia.", "libGLESv", "libnvidia-glcore.", "libnvidia-eglcore.")),
)


def driver_root_checks(settings: HostSettings, version: str) -> tuple[DriverRoot | None, list[CheckResult]]:
    """The driver root of driver ``version`` (None where it is not found, or not looked for on a simulated node
    without one) and the checks of its files."""
    if settings.simulated and not settings.driver_root:
        return None, [CheckResult("driver root", SKIP, "simulated node without --driver-root: run writes a stub root")]
    host, container = settings.host_root, settings.container_root
    try:
        root = discover_driver_root(host_root=host, container_root=container, version=version, cdi_hook=None)
    except DriverRootError as err:
        return None, [_libcuda_not_found(err, host, container, version)]
    checks = [libcuda_check(root), *library_class_checks(root), binaries_check(root), firmware_check(root, version)]
    return root, checks


def _libcuda_not_found(err: DriverRootError, host: PurePosixPath, container: Path, version: str) -> CheckResult:
    """The failure to find libcuda of ``version``, naming the roots that have it where there are any."""
    elsewhere = likely_driver_roots(container, host, version) if container.is_dir() else []
    fix = (
        f"the driver's files are under {' and '.join(elsewhere)}: set --driver-root {elsewhere[0]}"
        if elsewhere
        else "install the driver's user-space libraries of this version and run ldconfig; or set --driver-root "
        "to the root that has them"
    )
    detail = (
        f"libcuda.so.{version} not found in driver root {host} (its linker cache, ld.so.conf and the usual "
        "library directories searched)"
        if isinstance(err, DriverFilesMissing) and container.is_dir()
        else str(err).split(";")[0]
    )
    return CheckResult("libcuda", FAIL, detail, fix)


def libcuda_check(root: DriverRoot) -> CheckResult:
    """Where libcuda is, warning when only ``ld.so.conf`` lists it (the host's linker cache is stale)."""
    where = f"{root.host_root / root.libcuda.path} (through {root.libcuda.found_by})"
    if root.libcuda.found_by == FOUND_IN_CONF:
        return CheckResult("libcuda", WARN, where, "run ldconfig on the host: its linker cache does not list libcuda")
    return CheckResult("libcuda", OK, where)


def library_class_checks(root: DriverRoot) -> list[CheckResult]:
    """Each class of library (:data:`LIBRARY_CLASSES`) and where it is; only a missing NVML fails."""
    checks = []
    for name, prefixes in LIBRARY_CLASSES:
        files = [f for f in root.libraries if f.path.name.startswith(prefixes)]
        dirs = sorted({f"/{f.path.parent}" for f in files})
        if files:
            checks.append(CheckResult(f"{name} libraries", OK, f"{len(files)} in {', '.join(dirs)}"))
        elif name == "NVML":
            checks.append(CheckResult("NVML libraries", FAIL, "libnvidia-ml is missing", "reinstall the driver"))
        else:
            checks.append(CheckResult(f"{name} libraries", OK, "none (not installed with this driver)"))
    return checks


def binaries_check(root: DriverRoot) -> CheckResult:
    if any(f.path.name == "nvidia-smi" for f in root.binaries):
        return CheckResult("binaries", OK, ", ".join(f"/{f.path}" for f in root.binaries))
    return CheckResult("binaries", WARN, "nvidia-smi not found", "install the driver's utilities (nvidia-smi)")


def firmware_check(root: DriverRoot, version: str) -> CheckResult:
    if root.firmware:
        return CheckResult("GSP firmware", OK, f"{len(root.firmware)} file(s) in /{root.firmware[0].path.parent}")
    return CheckResult("GSP firmware", WARN, f"no nvidia/{version}/gsp*.bin", "needed by GPUs that run GSP firmware")


def libcuda_without_nvml(settings: HostSettings) -> CheckResult:
    """Without NVML the version is unknown: still say whether the root has a libcuda, and where else one is."""
    host, container = settings.host_root, settings.container_root
    found, how = find_library(container, "libcuda.so.1")
    if found is not None:
        return CheckResult("libcuda", WARN, f"{host / found} (through {how}), but NVML did not load", "see NVML above")
    elsewhere = [
        str(host / relative)
        for relative in KNOWN_ROOTS
        if find_library(container / relative, "libcuda.so.1")[0] is not None
    ]
    fix = f"set --driver-root {elsewhere[0]}" if elsewhere else ROOT_FIX
    return CheckResult("libcuda", FAIL, f"libcuda.so.1 not found in driver root {host} (searched {how})", fix)


def hook_check(settings: HostSettings) -> CheckResult:
    """The nvidia-cdi-hook the specs will call, judged as ``run`` finds it: the path given, else the image's hook
    (copied into the plugin directory at start), else the driver root's."""
    if settings.nvidia_cdi_hook_path == "none":
        return CheckResult("CDI hook", WARN, "hooks turned off", "specs still work; drop --nvidia-cdi-hook-path none")
    if settings.nvidia_cdi_hook_path:
        return CheckResult("CDI hook", OK, f"{settings.nvidia_cdi_hook_path} (as given)")
    source = settings.cdi_hook_source or shutil.which(HOOK_NAME) or ""
    if source and source != "none":
        # What run needs of it: a file to copy (the copy is made executable).
        if not Path(source).is_file():
            return CheckResult(
                "CDI hook",
                FAIL,
                f"--cdi-hook-source {source} is not a file",
                "give the image's nvidia-cdi-hook, or none to ship no hook",
            )
        return CheckResult("CDI hook", OK, f"{source}, copied to {settings.plugin_dir / HOOK_NAME} at start")
    in_root = regular_file(settings.container_root, PurePosixPath(CDI_HOOK))
    if in_root is not None:
        return CheckResult("CDI hook", OK, f"{settings.host_root / in_root} (in the driver root)")
    return CheckResult(
        "CDI hook",
        WARN,
        "no nvidia-cdi-hook: specs without hooks",
        "ship the image's hook (--cdi-hook-source) so images' linker caches list the driver's libraries",
    )
