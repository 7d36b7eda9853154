"""The driver root: the NVIDIA driver's user-space files that a CUDA container needs, found once at start.

A CUDA image carries the CUDA runtime but not the driver's libraries (``libcuda.so``, ``libnvidia-ml.so``, …) nor
tools such as ``nvidia-smi``: those must match the kernel module, so they come from the host. This module finds
them the way NVIDIA's container toolkit does:

- the driver version is the running one (from NVML), and ``libcuda.so.<version>`` must be there. It is looked
  up through the root's linker cache (``etc/ld.so.cache``) first, then the directories ``etc/ld.so.conf`` and its
  includes name, then the usual library directories — so a driver in ``/usr/local/nvidia/lib64`` registered in
  ``/etc/ld.so.conf.d/`` (GKE, many cloud images) is found like one in ``/usr/lib/x86_64-linux-gnu``;
- libraries: every ``*.so.<version>`` beside ``libcuda.so.<version>`` (and in its ``vdpau/``), every cache entry of
  that version, plus ``libnvidia-nvvm70.so.*``; their soname links, from the directory and from the cache;
- binaries (``nvidia-smi``, …) beside the library tree (``/usr/local/nvidia/bin``) or in the usual bin directories;
  the GSP firmware, the persistenced/fabricmanager sockets, and the graphics ICD files, each skipped when missing.

Where a file goes *in the container* does not depend on where the host keeps it (docs/cdi.md, "Container paths"):
libraries in both ``/usr/lib/<arch>-linux-gnu`` and ``/usr/lib64`` (the default search paths of Debian-family and
RHEL-family loaders, so a plain image finds them with no linker cache, hook or LD_LIBRARY_PATH), binaries in
``/usr/bin`` (on every image's PATH), firmware in ``/lib/firmware``, ICD files in ``/usr/share``.

Two roots name the same directory: ``host_root`` as the host (and so the container runtime) sees it, e.g. ``/``
or the GPU Operator's ``/run/nvidia/driver``, and ``container_root`` where the plugin's own container mounts it
(e.g. ``/driver-root``). Files are looked up under ``container_root``; CDI mounts name them under ``host_root``.
"""

from __future__ import annotations

import logging
import platform
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dradriver.errors import ConfigError
from dradriver.nvidia_install import ldcache
from dradriver.nvidia_install.cdi_hook import hook_version
from dradriver.nvidia_install.root_paths import directory as root_directory
from dradriver.nvidia_install.root_paths import regular_file, resolve

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
    "nvidia-xconfig",  # X.Org's configuration tool, for a container that runs an X server
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin", "usr/local/sbin")
#: Driver daemons' sockets a container may talk to (persistence mode, fabric manager); mounted when present.
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
FIRMWARE_DIRS = ("lib/firmware/updates", "lib/firmware")
#: Where the default path of NVIDIA's hook binary lives, relative to the driver root.
CDI_HOOK = "usr/bin/nvidia-cdi-hook"
EGL_PLATFORM_FILES = ("09_nvidia_wayland2.json", "10_nvidia_wayland.json", "15_nvidia_gbm.json", "20_nvidia_xcb.json",
                      "20_nvidia_xlib.json")  # fmt: skip
#: Where a root keeps loaders' configuration files, in the toolkit's order (the XDG data directories after /etc).
CONFIG_DIRS = ("etc", "usr/local/share", "usr/share")
#: The loaders' configuration files and OptiX's data, by their path under a configuration directory, each with
#: where it goes in the container: Vulkan's ICD and layers (also kept in the root itself, as GKE does), GLVND's EGL
#: vendor file, the EGL external platforms (Wayland, GBM, X11), the OpenCL ICD (without it the OpenCL loader
#: never finds libnvidia-opencl), OptiX's data file, and X.Org's configuration snippets.
CONFIG_FILES = (
    *(
        (f"vulkan/{name}", f"/usr/share/vulkan/{name}")
        for name in (
            "icd.d/nvidia_icd.json",
            "icd.d/nvidia_icd.x86_64.json",  # some RPM packages' name
            "icd.d/nvidia_icd.aarch64.json",
            "icd.d/nvidia_layers.json",
            "implicit_layer.d/nvidia_layers.json",
        )
    ),
    ("glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
    *(
        (f"egl/egl_external_platform.d/{name}", f"/usr/share/egl/egl_external_platform.d/{name}")
        for name in EGL_PLATFORM_FILES
    ),
    ("OpenCL/vendors/nvidia.icd", "/etc/OpenCL/vendors/nvidia.icd"),  # the only place the OpenCL loader looks
    ("nvidia/nvoptix.bin", "/usr/share/nvidia/nvoptix.bin"),  # OptiX ray tracing's data
    ("X11/xorg.conf.d/10-nvidia.conf", "/usr/share/X11/xorg.conf.d/10-nvidia.conf"),
    ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"),
)
#: The EGL external platform libraries, which carry versions of their own (``libnvidia-egl-gbm.so.1.1.2``): the
#: EGL platform files name them, so EGL on GBM, Wayland or X11 needs them.
EGL_PLATFORM_LIBRARY = re.compile(r"^libnvidia-egl-(gbm|wayland|wayland2|xcb|xlib)\.so\.\d+\.\d+")
#: The X.Org driver and GLX server modules, mounted where the host has them (an xorg.conf's ModulePath stays
#: right): (file name with ``{version}``, the development link the toolkit adds or None).
XORG_MODULES = (("nvidia_drv.so", None), ("libglxserver_nvidia.so.{version}", "libglxserver_nvidia.so"))
#: Debian multiarch triplets of the machines NVIDIA ships drivers for.
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu"}

# How a library was found (doctor reports it).
FOUND_IN_CACHE = "ld.so.cache"
FOUND_IN_CONF = "ld.so.conf"
FOUND_IN_DEFAULT = "default directory"


def triplet(machine: str | None = None) -> str:
    arch = machine or platform.machine()
    return TRIPLETS.get(arch, f"{arch}-linux-gnu")


def library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Directories (relative to the root) that may hold the driver's libraries, in the toolkit's search order."""
    arch = triplet(machine)
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


def container_library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Where every library goes in a container: the multiarch directory a Debian-family loader searches by
    default, and ``/usr/lib64``, which a RHEL-family loader searches (neither needs a cache entry)."""
    return (f"/usr/lib/{triplet(machine)}", "/usr/lib64")


class DriverRootError(ConfigError):
    """The driver root is wrong, or lacks what every CUDA container needs (libcuda.so of the running driver)."""


class DriverFilesMissing(DriverRootError):
    """The root's directory, or libcuda.so of the running driver in it, is not there (yet): the GPU Operator may
    still be installing the driver, so ``dradriver run`` waits for it."""


@dataclass(frozen=True)
class DriverFile:
    """One file of the driver root: where the plugin reads it, and where a container gets it."""

    path: PurePosixPath  # relative to the root, e.g. usr/local/nvidia/lib64/libcuda.so.580.65.06
    container_paths: tuple[str, ...]  # absolute, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
    found_by: str = ""  # for libraries: FOUND_IN_CACHE, FOUND_IN_CONF or FOUND_IN_DEFAULT


@dataclass(frozen=True)
class Symlink:
    """A link the container needs: ``link`` (absolute container path) pointing at ``target`` (as written).

    ``library``: the root-relative file it names when the host has this name for a library (a soname link such
    as ``libcuda.so.1``), so a spec without hooks mounts the library under it; None for a link only the hook
    creates (``libcuda.so``)."""

    target: str
    link: str
    library: PurePosixPath | None = None


@dataclass(frozen=True)
class DriverRoot:
    """The discovered driver files; see the module docstring for the two roots and the container paths."""

    host_root: PurePosixPath
    container_root: Path
    version: str
    machine: str
    libcuda: DriverFile
    libraries: tuple[DriverFile, ...]
    symlinks: tuple[Symlink, ...]
    firmware: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    sockets: tuple[DriverFile, ...]
    config_files: tuple[DriverFile, ...]
    cdi_hook: str | None  # host path of nvidia-cdi-hook, None when there is none
    source_dirs: tuple[PurePosixPath, ...] = ()  # root-relative directories the libraries came from
    xorg_modules: tuple[DriverFile, ...] = ()  # X.Org's driver and GLX modules, at their host path in the container
    cdi_hook_version: str | None = None  # what the hook says it is (None: it could not be asked): which hooks exist

    def host_path(self, file: DriverFile) -> str:
        """The host path the container runtime binds for ``file`` (the container root rewritten to the host's)."""
        return str(self.host_root / file.path)

    @property
    def library_dirs(self) -> tuple[str, ...]:
        """The container directories holding the mounted libraries, for the linker cache."""
        return container_library_dirs(self.machine)


def find_library(root: Path, name: str, *, machine: str | None = None) -> tuple[PurePosixPath | None, str]:
    """``name`` (a soname or file name) in ``root`` the way its loader would find it: (root-relative real file,
    how it was found), or (None, the places searched)."""
    cache = ldcache.read_cache(root, machine)
    searched: list[str] = []
    if cache is not None:
        for entry in cache:
            if entry.soname == name:
                found = regular_file(root, PurePosixPath(entry.path.lstrip("/")))
                if found is not None:
                    return found, FOUND_IN_CACHE
        searched.append("/etc/ld.so.cache")
    for how, dirs in _search_dirs(root, machine):
        for directory in dirs:
            found = regular_file(root, directory / name)
            if found is not None:
                return found, how
            searched.append(f"/{directory}")
    return None, ", ".join(searched)


def _search_dirs(root: Path, machine: str | None) -> list[tuple[str, tuple[PurePosixPath, ...]]]:
    conf = tuple(PurePosixPath(str(d).lstrip("/")) for d in ldcache.conf_dirs(root))
    return [(FOUND_IN_CONF, conf), (FOUND_IN_DEFAULT, tuple(PurePosixPath(d) for d in library_dirs(machine)))]


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
    machine = machine or platform.machine()
    _check_roots(host, root)
    cache = ldcache.read_cache(root, machine) or ()
    libcuda_dir, libcuda, found_by = _find_libcuda(root, version, cache, machine)
    # Where libcuda was found, and where its file really is when that is a link into another directory.
    sources = tuple(dict.fromkeys(d for d in (resolve(root, libcuda_dir), libcuda.parent) if d is not None))
    libraries, sonames = _libraries(root, sources, version=version, cache=cache, found_by=found_by, machine=machine)
    xorg_modules, xorg_links = _xorg_modules(root, sources, version)
    hook = _cdi_hook_path(cdi_hook, root, host)
    found_root = DriverRoot(
        host_root=host,
        container_root=root,
        version=version,
        machine=machine,
        libcuda=next(f for f in libraries if f.path == libcuda),
        libraries=libraries,
        symlinks=(*_symlinks(libraries, sonames, machine), *xorg_links),
        firmware=_firmware(root, version, kernel_release or platform.release(), sources),
        binaries=_binaries(root, sources),
        sockets=_sockets(root),
        config_files=_config_files(root),
        cdi_hook=hook,
        source_dirs=sources,
        xorg_modules=xorg_modules,
        cdi_hook_version=_cdi_hook_version(cdi_hook, hook, root, host),
    )
    log.info(
        "driver root host=%s container=%s version=%s libcuda=/%s found_by=%s libraries=%d binaries=%s firmware=%d "
        "hook=%s hook_version=%s",
        host,
        root,
        version,
        libcuda,
        found_by,
        len(libraries),
        ",".join(f.path.name for f in found_root.binaries) or "-",
        len(found_root.firmware),
        found_root.cdi_hook or "-",
        found_root.cdi_hook_version or "-",
    )
    return found_root


def _check_roots(host: PurePosixPath, root: Path) -> None:
    """Refuse a host path that is not absolute, and a container root that is not a directory."""
    if not host.is_absolute():
        raise DriverRootError(
            f"--driver-root {host} is not an absolute path; give the host path, e.g. / or /run/nvidia/driver"
        )
    if not root.is_dir():
        raise DriverFilesMissing(
            f"driver root {root} is not a directory: mount the host's driver root (--driver-root {host}) into "
            "the plugin's container and pass that mount as --container-driver-root"
        )


def _find_libcuda(
    root: Path, version: str, cache: tuple[ldcache.CacheEntry, ...], machine: str
) -> tuple[PurePosixPath, PurePosixPath, str]:
    """``libcuda.so.<version>``: (directory where it was found, its real file, how); an error that names the places
    searched and what to do when it is not there."""
    libcuda_name = f"libcuda.so.{version}"
    located = _locate(root, libcuda_name, cache, machine)
    if isinstance(located, list):
        raise DriverFilesMissing(
            f"{libcuda_name} of the running NVIDIA driver {version} was not found in driver root {root} "
            f"(searched {', '.join(located)}); install the driver's user-space libraries (and run ldconfig if "
            "they are outside the usual directories), or point --driver-root (host path, e.g. /run/nvidia/driver "
            "with the GPU Operator) and --container-driver-root (its mount in this container) at the root that "
            "has them"
        )
    return located


def _binaries(root: Path, sources: tuple[PurePosixPath, ...]) -> tuple[DriverFile, ...]:
    """NVIDIA's binaries, each the first found beside the library tree (``<lib>/../bin``) or in the usual bin
    directories, as ``/usr/bin/<name>`` in the container."""
    bin_dirs = (*(str(d.parent / "bin") for d in sources), *BINARY_DIRS)
    return tuple(
        DriverFile(path, (f"/usr/bin/{name}",)) for name in BINARIES if (path := _first_file(root, bin_dirs, name))
    )


def _sockets(root: Path) -> tuple[DriverFile, ...]:
    """The driver daemons' sockets the root has, at the same path under ``/run`` in the container."""
    return tuple(
        DriverFile(path, (f"/run/{sock}",))
        for sock in IPC_SOCKETS
        if (path := resolve(root, PurePosixPath("run", sock)))
    )


def _config_files(root: Path) -> tuple[DriverFile, ...]:
    """The loaders' configuration files the root has (the first of each in ``CONFIG_DIRS``; Vulkan's also in the
    root itself), where the container's loaders look for them."""
    found = []
    for relative, inside in CONFIG_FILES:
        dirs = (*CONFIG_DIRS, ".") if relative.startswith("vulkan/") else CONFIG_DIRS
        path = _first_file(root, dirs, relative)
        if path is not None:
            found.append(DriverFile(path, (inside,)))
    return tuple(found)


def _xorg_modules(
    root: Path, sources: tuple[PurePosixPath, ...], version: str
) -> tuple[tuple[DriverFile, ...], tuple[Symlink, ...]]:
    """X.Org's NVIDIA driver and GLX server modules, each the first found in X.Org's module directories (beside the
    library tree first), at the same path in the container, with the GLX module's development link."""
    bases = [*(str(d) for d in sources), "usr/lib", "usr/lib64"]
    dirs = [f"{d}/nvidia/xorg" for d in sources]
    subdirs = ("drivers", "extensions", "updates/drivers", "updates/extensions")
    dirs += [f"{b}/xorg/modules/{sub}" for b in bases for sub in subdirs]
    dirs += [f"usr/X11R6/{lib}/modules/{sub}" for lib in ("lib", "lib64") for sub in subdirs]
    modules, links = [], []
    for pattern, dev_link in XORG_MODULES:
        name = pattern.format(version=version)
        where = next((d for d in dirs if regular_file(root, PurePosixPath(d, name))), None)
        real = regular_file(root, PurePosixPath(where, name)) if where else None
        if where is None or real is None:
            continue
        modules.append(DriverFile(real, (f"/{where}/{name}",)))
        if dev_link is not None:
            links.append(Symlink(name, f"/{where}/{dev_link}", real))
    return tuple(modules), tuple(links)


def _cdi_hook_version(given: str | None, hook: str | None, root: Path, host: PurePosixPath) -> str | None:
    """The hook's version, asked of the file this container sees: the driver root's hook under the container
    root, a given path where it is the same here (the image's copy in the plugin directory); None when there is no
    hook or it cannot be asked (a path only the host has)."""
    if hook is None:
        return None
    if given == "":
        return hook_version(root / PurePosixPath(hook).relative_to(host))
    return hook_version(Path(hook))


def _cdi_hook_path(cdi_hook: str | None, root: Path, host: PurePosixPath) -> str | None:
    """The host path of ``nvidia-cdi-hook`` (see ``discover_driver_root``'s ``cdi_hook``), None when there is none."""
    if cdi_hook != "":
        return cdi_hook
    # The runtime runs the hook on the host, which would follow an absolute link from the host's / rather than the
    # driver root's: name the file the link leads to.
    in_root = regular_file(root, PurePosixPath(CDI_HOOK))
    return str(host / in_root) if in_root is not None else None


def _locate(
    root: Path, name: str, cache: tuple[ldcache.CacheEntry, ...], machine: str
) -> tuple[PurePosixPath, PurePosixPath, str] | list[str]:
    """(directory where ``name`` was found, its real file, how), or the places searched. The cache names
    ``libcuda.so.1``, not the versioned file: its directory is where to look (a stale cache after an upgrade still
    points at the right directory)."""
    searched = []
    candidates: list[tuple[str, PurePosixPath]] = []
    for entry in cache:
        if entry.soname.startswith("libcuda.so"):
            cached = PurePosixPath(entry.path.lstrip("/"))
            # The link's directory, and its file's (Debian keeps the files in nvidia/current below the links).
            real = regular_file(root, cached)
            candidates.extend((FOUND_IN_CACHE, d) for d in (cached.parent, real.parent if real else None) if d)
    if cache:
        searched.append("the directories /etc/ld.so.cache lists for libcuda")
    for how, dirs in _search_dirs(root, machine):
        candidates.extend((how, d) for d in dirs)
    for how, directory in dict.fromkeys(candidates):
        found = regular_file(root, directory / name)
        if found is not None:
            return directory, found, how
        if how != FOUND_IN_CACHE:
            searched.append(str(root / directory))
    return searched


def _libraries(
    root: Path,
    dirs: tuple[PurePosixPath, ...],
    *,
    version: str,
    cache: tuple[ldcache.CacheEntry, ...],
    found_by: str,
    machine: str,
) -> tuple[tuple[DriverFile, ...], dict[PurePosixPath, set[str]]]:
    """Every ``*.so.<version>`` (and ``libnvidia-nvvm70.so.*``) in each directory that holds versioned driver
    libraries, with its ``vdpau/`` subdirectory, and every cache entry of that version; symlinks resolved inside
    the root, dangling ones skipped. Also each library's other names (soname links) from the directories and
    the cache."""
    found: dict[PurePosixPath, bool] = {}  # real file → in vdpau/
    names: dict[PurePosixPath, set[str]] = {}
    for directory in dirs:
        for below, vdpau in ((directory, False), (directory / "vdpau", True)):
            sub = root_directory(root, below)
            if sub is None:
                continue
            for entry in sorted((root / sub).iterdir(), key=lambda e: e.name):
                resolved = regular_file(root, sub / entry.name)
                if resolved is None:
                    continue
                if _driver_library(entry.name, version):
                    found.setdefault(resolved, vdpau)
                elif entry.is_symlink() and ".so" in entry.name:
                    names.setdefault(resolved, set()).add(entry.name)
    for cached in cache:
        resolved = regular_file(root, PurePosixPath(cached.path.lstrip("/")))
        if resolved is not None and _driver_library(resolved.name, version):
            found.setdefault(resolved, resolved.parent.name == "vdpau")
            names.setdefault(resolved, set()).add(cached.soname)
    libraries = tuple(
        DriverFile(
            path,
            tuple(f"{d}/vdpau/{path.name}" if vdpau else f"{d}/{path.name}" for d in container_library_dirs(machine)),
            found_by,
        )
        for path, vdpau in found.items()
    )
    return libraries, {path: {n for n in names.get(path, set()) if n != path.name} for path in found}


def _driver_library(name: str, version: str) -> bool:
    """Whether ``name`` is a library of driver ``version``: ``*.so.<version>``, the legacy NVVM and the EGL
    platform libraries (versions of their own)."""
    return (
        name.endswith(f".so.{version}")
        or name.startswith("libnvidia-nvvm70.so.")
        or bool(EGL_PLATFORM_LIBRARY.match(name))
    )


def _symlinks(
    libraries: tuple[DriverFile, ...], sonames: dict[PurePosixPath, set[str]], machine: str
) -> tuple[Symlink, ...]:
    """Each library's soname links in every container library directory, plus the links NVIDIA's toolkit adds:
    the development links ``libcuda.so`` and ``libnvidia-opticalflow.so`` (which NVIDIA's installer omits), GLX's
    indirect-rendering name and GBM's backend name."""
    links: dict[str, Symlink] = {}
    dirs = container_library_dirs(machine)
    for lib in libraries:
        inside = "/vdpau" if lib.container_paths[0].endswith(f"/vdpau/{lib.path.name}") else ""
        for name in sorted(sonames.get(lib.path, ())):
            for d in dirs:
                links.setdefault(f"{d}{inside}/{name}", Symlink(lib.path.name, f"{d}{inside}/{name}", lib.path))
        for prefix, target, link in (
            ("libcuda.so.", "libcuda.so.1", "libcuda.so"),
            ("libnvidia-opticalflow.so.", "libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
            ("libGLX_nvidia.so.", lib.path.name, "libGLX_indirect.so.0"),
            ("libnvidia-allocator.so.", "../libnvidia-allocator.so.1", "gbm/nvidia-drm_gbm.so"),
        ):
            if lib.path.name.startswith(prefix) and not inside:
                for d in dirs:
                    links.setdefault(f"{d}/{link}", Symlink(target, f"{d}/{link}"))
    return tuple(links.values())


def _firmware(
    root: Path, version: str, kernel_release: str, sources: tuple[PurePosixPath, ...]
) -> tuple[DriverFile, ...]:
    """The GSP firmware files of this driver version, from the first firmware directory that has them."""
    candidates = (
        f"lib/firmware/updates/{kernel_release}",
        FIRMWARE_DIRS[0],
        f"lib/firmware/{kernel_release}",
        FIRMWARE_DIRS[1],
        *(str(d.parent / "firmware") for d in sources),  # beside the library tree (/home/kubernetes/bin/nvidia)
    )
    for base in candidates:
        folder = root_directory(root, PurePosixPath(base, "nvidia", version))
        if folder is not None:
            # GSP firmware, and from the R615 drivers on the ucode files beside it.
            files = sorted(p.name for pattern in ("gsp*.bin", "ucode*.bin") for p in (root / folder).glob(pattern))
            found = [(name, f) for name in files if (f := regular_file(root, folder / name))]
            if found:
                return tuple(
                    DriverFile(f, (f"/lib/firmware/nvidia/{version}/{name}",)) for name, f in dict(found).items()
                )
    return ()


def _first_file(root: Path, dirs: tuple[str, ...] | list[str], name: str) -> PurePosixPath | None:
    for directory in dirs:
        found = regular_file(root, PurePosixPath(directory) / name)
        if found is not None:
            return found
    return None


#: Roots other installs use, relative to the host's /: the GPU Operator's driver container, GKE/COS, and the
#: /usr/local/nvidia tree of many cloud images (a root of its own when ld.so.conf does not name it).
KNOWN_ROOTS = ("run/nvidia/driver", "home/kubernetes/bin/nvidia", "usr/local/nvidia")


def likely_driver_roots(
    container_root: Path, host_root: PurePosixPath, version: str, machine: str | None = None
) -> list[str]:
    """Host paths under ``host_root`` where driver ``version``'s files are, for an error's fix when the given root
    lacks them (a GPU Operator node run with ``--driver-root /``)."""
    found = []
    for relative in KNOWN_ROOTS:
        try:
            discover_driver_root(
                host_root=host_root / relative,
                container_root=container_root / relative,
                version=version,
                cdi_hook=None,
                machine=machine,
            )
        except DriverRootError:
            continue
        found.append(str(host_root / relative))
    return found
