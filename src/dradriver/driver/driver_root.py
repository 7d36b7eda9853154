"""The driver root: the NVIDIA driver's user-space files that a CUDA container needs, found once at start.

A CUDA image carries the CUDA runtime but not the driver's libraries (``libcuda.so``, ``libnvidia-ml.so``, …) nor
tools such as ``nvidia-smi``: those must match the kernel module, so they come from the host. This module finds
them the way NVIDIA's container toolkit does for ``nvidia-ctk cdi generate``:

- the driver version is the running one (from NVML), and ``libcuda.so.<version>`` must be there;
- libraries: every ``*.so.<version>`` in the library directory that holds ``libcuda.so.<version>`` (the first in
  the toolkit's search order) and its ``vdpau/`` subdirectory, plus ``libnvidia-nvvm70.so.*``;
- the soname links the installer made (``libcuda.so.1`` → ``libcuda.so.<version>``), to recreate in the container;
- the GSP firmware (``lib/firmware/nvidia/<version>/gsp*.bin``), the binaries (``nvidia-smi``, …) and the
  persistenced/fabricmanager sockets, each skipped when missing.

Two roots name the same directory: ``host_root`` as the host (and so the container runtime) sees it, e.g. ``/``
or the GPU Operator's ``/run/nvidia/driver``, and ``container_root`` where the plugin's own container mounts it
(e.g. ``/driver-root``). Files are looked up under ``container_root``; CDI mounts name them under ``host_root``;
inside a workload container each file sits at its path relative to the root (``/usr/bin/nvidia-smi``).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dradriver.errors import ConfigError

log = logging.getLogger(__name__)

#: The binaries NVIDIA's toolkit mounts, in its order; each is optional.
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin")
#: Driver daemons' sockets a container may talk to (persistence mode, fabric manager); mounted when present.
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
FIRMWARE_DIRS = ("lib/firmware/updates", "lib/firmware")
#: Where the default path of NVIDIA's hook binary lives, relative to the driver root.
CDI_HOOK = "usr/bin/nvidia-cdi-hook"


def library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Directories (relative to the root) that may hold the driver's libraries, in the toolkit's search order."""
    arch = f"{machine or platform.machine()}-linux-gnu"
    return (
        "usr/lib64",
        f"usr/lib/{arch}",
        f"usr/lib/{arch}/nvidia/current",
        "lib64",
        f"lib/{arch}",
        f"lib/{arch}/nvidia/current",
        "usr/lib",
        "lib",
    )


class DriverRootError(ConfigError):
    """The driver root lacks what every CUDA container needs (libcuda.so of the running driver)."""


@dataclass(frozen=True)
class DriverFile:
    """One file of the driver root: where the plugin reads it, and the path it has inside the root."""

    path: PurePosixPath  # relative to the root, e.g. usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06

    @property
    def container_path(self) -> str:
        """The path inside a workload container (the same as on a host whose driver root is ``/``)."""
        return f"/{self.path}"


@dataclass(frozen=True)
class Symlink:
    """A link the container needs: ``link`` (absolute container path) pointing at ``target`` (as written).

    ``installed``: the link exists in the driver root (a soname link), rather than being one the toolkit adds."""

    target: str
    link: str
    installed: bool = True


@dataclass(frozen=True)
class DriverRoot:
    """The discovered driver files; see the module docstring for the two roots."""

    host_root: PurePosixPath
    container_root: Path
    version: str
    libcuda: DriverFile
    libraries: tuple[DriverFile, ...]
    symlinks: tuple[Symlink, ...]
    firmware: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    sockets: tuple[DriverFile, ...]
    cdi_hook: str | None  # host path of nvidia-cdi-hook, None when there is none

    def host_path(self, file: DriverFile) -> str:
        """The host path the container runtime binds for ``file`` (the container root rewritten to the host's)."""
        return str(self.host_root / file.path)

    @property
    def library_dirs(self) -> tuple[str, ...]:
        """The container directories holding the mounted libraries, for the linker cache."""
        return tuple(dict.fromkeys(str(PurePosixPath(f.container_path).parent) for f in self.libraries))


def discover_driver_root(
    *,
    host_root: str | PurePosixPath,
    container_root: str | Path | None = None,
    version: str,
    cdi_hook: str | None = "",
    machine: str | None = None,
    kernel_release: str | None = None,
) -> DriverRoot:
    """Find the driver files of driver ``version`` under ``container_root`` (default: ``host_root``).

    ``cdi_hook``: ``""`` finds ``usr/bin/nvidia-cdi-hook`` in the driver root, ``None`` disables the hooks, and a
    path is taken as the hook's host path as given (the toolkit may live outside the driver root).
    Raises :class:`DriverRootError` when ``libcuda.so.<version>`` is not there.
    """
    host = PurePosixPath(str(host_root))
    root = Path(container_root if container_root is not None else str(host_root))
    if not host.is_absolute():
        raise DriverRootError(
            f"--driver-root {host} is not an absolute path; give the host path, e.g. / or /run/nvidia/driver"
        )
    if not root.is_dir():
        raise DriverRootError(
            f"driver root {root} is not a directory: mount the host's driver root (--driver-root {host}) into "
            "the plugin's container and pass that mount as --container-driver-root"
        )
    dirs = library_dirs(machine)
    libcuda_name = f"libcuda.so.{version}"
    located = next(
        ((d, found) for d in dirs if (found := _regular_file(root, PurePosixPath(d) / libcuda_name)) is not None),
        None,
    )
    if located is None:
        searched = ", ".join(f"{root}/{d}" for d in dirs)
        raise DriverRootError(
            f"{libcuda_name} of the running NVIDIA driver {version} was not found in driver root {root} "
            f"(searched {searched}); install the driver's user-space libraries, or point --driver-root (host "
            "path, e.g. /run/nvidia/driver with the GPU Operator) and --container-driver-root (its mount in "
            "this container) at the root that has them"
        )
    # The driver's libraries sit beside libcuda: the first directory in search order that has it is the native
    # one (a 64-bit host's /usr/lib may hold the 32-bit compatibility copies, which must not shadow it).
    native_dir, libcuda = located
    # Where libcuda was found, and where its file really is when that is a link into another directory.
    native = tuple(dict.fromkeys(str(d) for d in (_resolve(root, PurePosixPath(native_dir)), libcuda.parent) if d))
    libraries = _libraries(root, native, version)
    symlinks = _soname_links(root, native, {f.path for f in libraries})
    firmware = _firmware(root, version, kernel_release or platform.release())
    binaries = tuple(DriverFile(path) for name in BINARIES if (path := _first_file(root, BINARY_DIRS, name)))
    sockets = tuple(DriverFile(PurePosixPath("run") / sock) for sock in IPC_SOCKETS if (root / "run" / sock).exists())
    hook: str | None
    if cdi_hook == "":
        hook = str(host / CDI_HOOK) if _regular_file(root, PurePosixPath(CDI_HOOK)) is not None else None
    else:
        hook = cdi_hook
    found_root = DriverRoot(
        host_root=host,
        container_root=root,
        version=version,
        libcuda=DriverFile(libcuda),
        libraries=libraries,
        symlinks=symlinks,
        firmware=firmware,
        binaries=binaries,
        sockets=sockets,
        cdi_hook=hook,
    )
    log.info(
        "driver root host=%s container=%s version=%s libraries=%d binaries=%s firmware=%d hook=%s",
        host,
        root,
        version,
        len(libraries),
        ",".join(f.path.name for f in binaries) or "-",
        len(firmware),
        hook or "-",
    )
    return found_root


def _libraries(root: Path, dirs: tuple[str, ...], version: str) -> tuple[DriverFile, ...]:
    """Every ``*.so.<version>`` (and ``libnvidia-nvvm70.so.*``) in each directory that holds versioned driver
    libraries, with its ``vdpau/`` subdirectory; symlinks resolved inside the root, dangling ones skipped."""
    found: dict[PurePosixPath, DriverFile] = {}
    for directory in dirs:
        for sub in (PurePosixPath(directory), PurePosixPath(directory) / "vdpau"):
            folder = root / sub
            if not folder.is_dir():
                continue
            names = sorted(
                entry.name
                for entry in folder.iterdir()
                if entry.name.endswith(f".so.{version}") or entry.name.startswith("libnvidia-nvvm70.so.")
            )
            for name in names:
                resolved = _regular_file(root, sub / name)
                if resolved is not None:
                    found.setdefault(resolved, DriverFile(resolved))
    return tuple(found.values())


def _soname_links(root: Path, dirs: tuple[str, ...], libraries: set[PurePosixPath]) -> tuple[Symlink, ...]:
    """The links the driver installer (ldconfig) made to a found library, such as ``libcuda.so.1``, plus the
    development link ``libcuda.so`` that the toolkit adds: applications ``dlopen`` these names."""
    links: dict[str, Symlink] = {}
    for directory in dirs:
        folder = root / directory
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if not entry.is_symlink() or ".so" not in entry.name:
                continue
            target = _regular_file(root, PurePosixPath(directory) / entry.name)
            if target is None or target not in libraries or target.name == entry.name:
                continue
            link = f"/{directory}/{entry.name}"
            links.setdefault(link, Symlink(os.readlink(entry), link))
    for lib in libraries:
        if lib.name.startswith("libcuda.so."):
            dev_link = f"/{lib.parent}/libcuda.so"
            links.setdefault(dev_link, Symlink("libcuda.so.1", dev_link, installed=False))
    return tuple(links.values())


def _firmware(root: Path, version: str, kernel_release: str) -> tuple[DriverFile, ...]:
    """The GSP firmware files of this driver version, from the first firmware directory that has them."""
    candidates = (
        f"lib/firmware/updates/{kernel_release}",
        FIRMWARE_DIRS[0],
        f"lib/firmware/{kernel_release}",
        FIRMWARE_DIRS[1],
    )
    for base in candidates:
        folder = root / base / "nvidia" / version
        if folder.is_dir():
            files = sorted(p.name for p in folder.glob("gsp*.bin"))
            found = [f for name in files if (f := _regular_file(root, PurePosixPath(base) / "nvidia" / version / name))]
            if found:
                return tuple(DriverFile(f) for f in dict.fromkeys(found))
    return ()


def _first_file(root: Path, dirs: tuple[str, ...], name: str) -> PurePosixPath | None:
    for directory in dirs:
        found = _regular_file(root, PurePosixPath(directory) / name)
        if found is not None:
            return found
    return None


def _regular_file(root: Path, relative: PurePosixPath) -> PurePosixPath | None:
    """``relative`` resolved inside ``root`` if it ends at a regular file, else None."""
    resolved = _resolve(root, relative)
    return resolved if resolved is not None and (root / resolved).is_file() else None


def _resolve(root: Path, relative: PurePosixPath, *, depth: int = 0) -> PurePosixPath | None:
    """``relative`` with symlinks followed *inside* ``root`` (an absolute link target means root-relative, as
    on the host); None when missing, dangling or looping. ``..`` never leaves the root."""
    if depth > 40:
        return None
    current = PurePosixPath()
    parts = relative.parts
    for index, part in enumerate(parts):
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        candidate = root / current / part
        if candidate.is_symlink():
            target = PurePosixPath(os.readlink(candidate))
            rest = PurePosixPath(*parts[index + 1 :]) if index + 1 < len(parts) else PurePosixPath()
            base = PurePosixPath() if target.is_absolute() else current
            joined = PurePosixPath(*[p for p in (base / target / rest).parts if p != "/"])
            return _resolve(root, _normalise(joined), depth=depth + 1)
        current = current / part
    return current if (root / current).exists() and not (root / current).is_symlink() else None


def _normalise(path: PurePosixPath) -> PurePosixPath:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", ".", "/"):
            parts.append(part)
    return PurePosixPath(*parts)
