"""Real NVIDIA driver install layouts as test fixtures, built from stub shared objects with the real SONAMEs.

Each stub is a real ELF library compiled with ``cc`` (``-Wl,-soname``) exporting a function the real one has
(``cuDriverGetVersion``, ``nvmlSystemGetDriverVersion``, …), so a program can ``dlopen`` it by soname and call
it; ``nvidia-smi`` is a small program that loads ``libnvidia-ml.so.1`` by soname as the real one does. Where the
install runs ``ldconfig``, the root's linker cache is made by the real ``ldconfig -r``. The stubs are compiled
once per test session (:func:`build_stubs`) and copied into each layout.

The layouts (``LAYOUTS``), each with what ``--driver-root`` a user gives on such a node:

- ``debian``: Debian's packages: files in ``usr/lib/<arch>/nvidia/current``, soname links in ``usr/lib/<arch>``;
- ``runfile``: NVIDIA's ``.run`` installer on Ubuntu: everything flat in ``usr/lib/<arch>``, ``usr/bin``;
- ``rhel``: RHEL packages: ``usr/lib64`` (32-bit copies in ``usr/lib``), ``usr/bin``;
- ``gpu-operator``: the GPU Operator's driver container, a full root at ``run/nvidia/driver``; its toolkit (and
  so the hook) at ``usr/local/nvidia/toolkit`` on the host;
- ``gke``: GKE/COS: ``home/kubernetes/bin/nvidia/{lib64,bin}``, no cache entry (``--driver-root`` is that dir);
- ``h100``: the lent H100 node: ``usr/local/nvidia/{lib64,bin}`` registered in ``etc/ld.so.conf.d`` and cached,
  ``--driver-root /``;
- ``full``: a realistic full file set of a 580-series driver as NVIDIA's ``.run`` installer leaves it on Ubuntu: every
  library NVIDIA's CDI generator looks for (the EGL platform libraries of their own versions, ``libnvidia-nvvm70``,
  the X.Org modules), its binaries, firmware, loader files (Vulkan, EGL, OpenCL, X.Org, OptiX), the daemons' real
  sockets and the linker cache; ``--driver-root /``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support import required

VERSION = "580.159.04"
ARCH = "x86_64-linux-gnu"

STUB_C = r"""
#include <string.h>
int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *version) { *version = 13000; return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlSystemGetDriverVersion(char *out, unsigned length) {
    strncpy(out, DRIVER_VERSION, length); return 0;
}
int stub_library_present(void) { return 1; }
"""

# nvidia-smi: loads NVML by soname from the default search path, like the real tool.
SMI_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) { printf("NVIDIA-SMI has failed: %s\n", dlerror()); return 9; }
    int (*version)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
    char buf[80] = "";
    version(buf, sizeof buf);
    if (argc > 1 && strcmp(argv[1], "-L") == 0) printf("GPU 0: NVIDIA H100 80GB HBM3 (stub driver %s)\n", buf);
    else printf("NVIDIA-SMI stub, driver version %s\n", buf);
    return 0;
}
"""

# The workload: what a CUDA program needs of the driver, and nvidia-smi from PATH.
PROBE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("FAIL libcuda: %s\n", dlerror()); return 3; }
    int (*get)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    int v = 0;
    if (!get || get(&v) != 0) { printf("FAIL cuDriverGetVersion\n"); return 4; }
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) { printf("FAIL libnvidia-ml: %s\n", dlerror()); return 5; }
    int (*ver)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
    char buf[80] = "";
    if (!ver || ver(buf, sizeof buf) != 0) { printf("FAIL nvmlSystemGetDriverVersion\n"); return 6; }
    printf("OK cuda=%d driver=%s\n", v, buf);
    fflush(stdout);
    execlp("nvidia-smi", "nvidia-smi", "-L", (char *)0);
    printf("FAIL nvidia-smi: not on PATH\n");
    return 7;
}
"""

VULKAN_ICD = '{"file_format_version": "1.0.1", "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.4"}}\n'

#: Library file stem → soname, as the real driver names them.
LIBRARIES = {
    "libcuda.so": "libcuda.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libnvidia-cfg.so": "libnvidia-cfg.so.1",
    "libnvidia-allocator.so": "libnvidia-allocator.so.1",
    "libnvidia-encode.so": "libnvidia-encode.so.1",
    "libnvcuvid.so": "libnvcuvid.so.1",
    "libGLX_nvidia.so": "libGLX_nvidia.so.0",
    "libEGL_nvidia.so": "libEGL_nvidia.so.0",
    "libnvidia-gpucomp.so": None,  # soname is the versioned name itself
}
VDPAU = {"libvdpau_nvidia.so": "libvdpau_nvidia.so.1"}
#: The rest of a 580 driver's versioned libraries (``full``), stem → soname (None: the versioned name itself).
FULL_LIBRARIES = {
    "libGLESv1_CM_nvidia.so": "libGLESv1_CM_nvidia.so.1",
    "libGLESv2_nvidia.so": "libGLESv2_nvidia.so.2",
    "libnvidia-eglcore.so": None,
    "libnvidia-fbc.so": "libnvidia-fbc.so.1",
    "libnvidia-glcore.so": None,
    "libnvidia-glsi.so": None,
    "libnvidia-glvkspirv.so": None,
    "libnvidia-gtk3.so": None,
    "libnvidia-ngx.so": "libnvidia-ngx.so.1",
    "libnvidia-opencl.so": "libnvidia-opencl.so.1",
    "libnvidia-opticalflow.so": "libnvidia-opticalflow.so.1",
    "libnvidia-pkcs11-openssl3.so": None,
    "libnvidia-present.so": None,
    "libnvidia-rtcore.so": None,
    "libnvidia-sandboxutils.so": "libnvidia-sandboxutils.so.1",
    "libnvidia-tls.so": None,
    "libnvidia-vksc-core.so": "libnvidia-vksc-core.so.1",
    "libnvidia-wayland-client.so": None,
    "libnvoptix.so": "libnvoptix.so.1",
}
#: Libraries a 580 driver ships under versions of their own: file → soname.
FULL_OWN_VERSIONS = {
    "libnvidia-nvvm70.so.4": "libnvidia-nvvm70.so.4",
    "libnvidia-api.so.1": "libnvidia-api.so.1",
    "libnvidia-egl-gbm.so.1.1.2": "libnvidia-egl-gbm.so.1",
    "libnvidia-egl-wayland.so.1.1.19": "libnvidia-egl-wayland.so.1",
    "libnvidia-egl-wayland2.so.1.0.0": "libnvidia-egl-wayland2.so.1",
    "libnvidia-egl-xcb.so.1.0.2": "libnvidia-egl-xcb.so.1",
    "libnvidia-egl-xlib.so.1.0.2": "libnvidia-egl-xlib.so.1",
}
#: The development links the installer makes (``libcuda.so`` → ``libcuda.so.1``, …).
FULL_DEV_LINKS = ("libcuda.so", "libnvidia-ml.so", "libnvcuvid.so", "libnvidia-encode.so", "libnvidia-cfg.so",
                  "libnvidia-allocator.so", "libnvidia-fbc.so", "libnvidia-opencl.so")  # fmt: skip
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control")
#: A 580 install's binaries: those NVIDIA's toolkit mounts, and some it leaves (settings, bug report, modprobe).
FULL_BINARIES = (
    *BINARIES,
    *("nvidia-persistenced", "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl", "nvidia-xconfig"),
    *("nvidia-settings", "nvidia-bug-report.sh", "nvidia-modprobe", "nvidia-ngx-updater"),
)
EGL_PLATFORMS = "usr/share/egl/egl_external_platform.d"
#: A 580 install's loader and data files (root-relative), each with the library it names (its stand-in content).
FULL_CONFIG_FILES = {
    "usr/share/glvnd/egl_vendor.d/10_nvidia.json": "libEGL_nvidia.so.0",
    f"{EGL_PLATFORMS}/09_nvidia_wayland2.json": "libnvidia-egl-wayland2.so.1",
    f"{EGL_PLATFORMS}/10_nvidia_wayland.json": "libnvidia-egl-wayland.so.1",
    f"{EGL_PLATFORMS}/15_nvidia_gbm.json": "libnvidia-egl-gbm.so.1",
    f"{EGL_PLATFORMS}/20_nvidia_xcb.json": "libnvidia-egl-xcb.so.1",
    f"{EGL_PLATFORMS}/20_nvidia_xlib.json": "libnvidia-egl-xlib.so.1",
    "usr/share/vulkan/icd.d/nvidia_icd.json": "libGLX_nvidia.so.0",
    "usr/share/vulkan/implicit_layer.d/nvidia_layers.json": "libGLX_nvidia.so.0",
    "etc/vulkansc/icd.d/nvidia_icd_vksc.json": "libnvidia-vksc-core.so.1",
    "etc/OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1",
    "usr/share/nvidia/nvoptix.bin": "libnvoptix.so.1",
    "usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf": "nvidia_drv.so",
}
#: The daemons' sockets a running node has (real UNIX sockets).
FULL_SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")


@dataclass(frozen=True)
class Stubs:
    """The compiled stubs: ``libs/<file>`` per library and ``vdpau/``, ``bin/nvidia-smi``, ``bin/probe``."""

    dir: Path
    version: str

    def library(self, stem: str) -> Path:
        return self.dir / "libs" / f"{stem}.{self.version}"


@dataclass(frozen=True)
class Layout:
    """A built layout: ``root`` is what stands for the host's ``/``; ``driver_root`` what ``--driver-root``
    names under it; ``hook_dir`` a host directory where this layout's toolkit keeps nvidia-cdi-hook, if any."""

    name: str
    root: Path
    driver_root: Path
    hook_dir: Path | None = None


def tools_missing() -> list[str]:
    return [tool for tool in ("cc", "ldconfig") if shutil.which(tool) is None]


def need_layout_tools() -> None:
    """Skip (or fail, support/required.py) without the tools the layouts are built with."""
    required.need_tools(tools_missing(), "driver layouts are built from ELF stubs with cc and the real ldconfig",
                        "apt-get install gcc libc-bin (`scripts/test` does)")  # fmt: skip


def build_stubs(dest: Path, version: str = VERSION) -> Stubs:
    """Compile every stub library, nvidia-smi and the probe program into ``dest``."""
    (dest / "libs/vdpau").mkdir(parents=True, exist_ok=True)
    (dest / "bin").mkdir(exist_ok=True)
    source = dest / "stub.c"
    source.write_text(STUB_C)
    # Compiled once, linked once per library (under its soname).
    _cc("-c", "-fPIC", f"-DDRIVER_VERSION={_c_string(version)}", "-o", dest / "stub.o", source)
    versioned = {**LIBRARIES, **FULL_LIBRARIES, **{f"vdpau/{k}": v for k, v in VDPAU.items()}}
    files = {**{f"{stem}.{version}": soname for stem, soname in versioned.items()}, **FULL_OWN_VERSIONS}
    for name, soname in files.items():
        _cc("-shared", f"-Wl,-soname,{soname or Path(name).name}", "-o", dest / "libs" / name, dest / "stub.o")
    (dest / "smi.c").write_text(SMI_C)
    _cc("-o", dest / "bin/nvidia-smi", dest / "smi.c")
    (dest / "probe.c").write_text(PROBE_C)
    _cc("-o", dest / "bin/probe", dest / "probe.c")
    return Stubs(dest, version)


def build_layout(name: str, base: Path, stubs: Stubs, *, hook: Path | None = None) -> Layout:
    """Lay out driver install ``name`` under ``base`` (see the module docstring)."""
    builder = _BUILDERS[name]
    root = base / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return builder(root, stubs, hook)


def _debian(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    real = root / "usr/lib" / ARCH / "nvidia/current"
    _install_libraries(stubs, real, links_in=root / "usr/lib" / ARCH, link_prefix="nvidia/current/")
    _install_binaries(stubs, root / "usr/bin")
    _firmware(root / "lib/firmware", stubs.version)
    _write(root / "usr/share/vulkan/icd.d/nvidia_icd.json", VULKAN_ICD)
    _ldconfig(root)
    return Layout("debian", root, root)


def _runfile(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    _install_libraries(stubs, root / "usr/lib" / ARCH)
    _install_binaries(stubs, root / "usr/bin")
    _firmware(root / "lib/firmware", stubs.version)
    _write(root / "etc/vulkan/icd.d/nvidia_icd.json", VULKAN_ICD)
    _ldconfig(root)
    return Layout("runfile", root, root)


def _rhel(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    _install_libraries(stubs, root / "usr/lib64")
    # The 32-bit compatibility copies (not ELF here: only their names matter, and ldconfig skips them).
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib" / f"libcuda.so.{stubs.version}").write_text("32-bit copy\n")
    _install_binaries(stubs, root / "usr/bin")
    _firmware(root / "usr/lib/firmware", stubs.version)
    (root / "lib").symlink_to("usr/lib")
    (root / "lib64").symlink_to("usr/lib64")
    # RHEL's ldconfig trusts /usr/lib64 built in; this machine's Debian ldconfig is told through the conf.
    _write(root / "etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    _write(root / "etc/ld.so.conf.d/lib64.conf", "/usr/lib64\n")
    _ldconfig(root)
    return Layout("rhel", root, root)


def _gpu_operator(root: Path, stubs: Stubs, hook: Path | None) -> Layout:
    driver = root / "run/nvidia/driver"
    _install_libraries(stubs, driver / "usr/lib" / ARCH)
    _install_binaries(stubs, driver / "usr/bin")
    _firmware(driver / "lib/firmware", stubs.version)
    _ldconfig(driver)
    toolkit = root / "usr/local/nvidia/toolkit"
    toolkit.mkdir(parents=True)
    if hook is not None:
        shutil.copy2(hook, toolkit / "nvidia-cdi-hook")
    return Layout("gpu-operator", root, driver, hook_dir=toolkit)


def _gke(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    nvidia = root / "home/kubernetes/bin/nvidia"
    _install_libraries(stubs, nvidia / "lib64")
    _install_binaries(stubs, nvidia / "bin")
    _firmware(nvidia / "firmware", stubs.version)
    return Layout("gke", root, nvidia)


def _h100(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    nvidia = root / "usr/local/nvidia"
    _install_libraries(stubs, nvidia / "lib64")
    _install_binaries(stubs, nvidia / "bin")
    _firmware(root / "lib/firmware", stubs.version)
    _write(root / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    _write(root / "etc/ld.so.conf.d/000_cuda.conf", "/usr/local/cuda/targets/x86_64-linux/lib\n")
    _write(root / "etc/ld.so.conf.d/nvidia.conf", "/usr/local/nvidia/lib64\n")
    (root / "usr/local/cuda/targets/x86_64-linux/lib").mkdir(parents=True)
    _ldconfig(root)
    return Layout("h100", root, root)


def _full(root: Path, stubs: Stubs, _hook: Path | None) -> Layout:
    libdir = root / "usr/lib" / ARCH
    _install_libraries(stubs, libdir)
    for stem, soname in FULL_LIBRARIES.items():
        _install_library(stubs, libdir, f"{stem}.{stubs.version}", soname)
    for name, soname in FULL_OWN_VERSIONS.items():
        _install_library(stubs, libdir, name, soname)
    for link in FULL_DEV_LINKS:
        (libdir / link).symlink_to(f"{link}.1")
    (libdir / "gbm").mkdir()
    (libdir / "gbm/nvidia-drm_gbm.so").symlink_to("../libnvidia-allocator.so.1")
    # The X.Org driver and GLX server modules.
    xorg = root / "usr/lib/xorg/modules"
    shutil.copy2(stubs.library("libnvidia-cfg.so"), _parent(xorg / "drivers/nvidia_drv.so"))
    glx = f"libglxserver_nvidia.so.{stubs.version}"
    shutil.copy2(stubs.library("libnvidia-cfg.so"), _parent(xorg / "extensions" / glx))
    (xorg / "extensions/libglxserver_nvidia.so").symlink_to(glx)
    _install_binaries(stubs, root / "usr/bin", FULL_BINARIES)
    _firmware(root / "lib/firmware", stubs.version, ("gsp_ga10x.bin", "gsp_tu10x.bin"))
    for path, library in FULL_CONFIG_FILES.items():
        json_file = path.endswith(".json")
        _write(root / path, f'{{"ICD": {{"library_path": "{library}"}}}}\n' if json_file else f"{library}\n")
    for path in FULL_SOCKETS:
        _unix_socket(root / path)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")  # absolute, as on Debian: inside the root, it means the root's /run
    _ldconfig(root)
    return Layout("full", root, root)


_BUILDERS = {
    "debian": _debian,
    "runfile": _runfile,
    "rhel": _rhel,
    "gpu-operator": _gpu_operator,
    "gke": _gke,
    "h100": _h100,
    "full": _full,
}
LAYOUTS = tuple(_BUILDERS)


def _install_libraries(stubs: Stubs, libdir: Path, *, links_in: Path | None = None, link_prefix: str = "") -> None:
    """Copy the stubs into ``libdir`` with their soname links (``links_in``: where the links go instead, as
    Debian's packages keep them one directory up)."""
    (libdir / "vdpau").mkdir(parents=True, exist_ok=True)
    link_dir = links_in or libdir
    for stem, soname in LIBRARIES.items():
        name = f"{stem}.{stubs.version}"
        shutil.copy2(stubs.dir / "libs" / name, libdir / name)
        if soname is not None:
            (link_dir / soname).symlink_to(f"{link_prefix}{name}")
    for stem, soname in VDPAU.items():
        name = f"{stem}.{stubs.version}"
        shutil.copy2(stubs.dir / "libs/vdpau" / name, libdir / "vdpau" / name)
        (libdir / "vdpau" / soname).symlink_to(name)


def _install_library(stubs: Stubs, libdir: Path, name: str, soname: str | None) -> None:
    shutil.copy2(stubs.dir / "libs" / name, libdir / name)
    if soname is not None and soname != name:
        (libdir / soname).symlink_to(name)


def _install_binaries(stubs: Stubs, bindir: Path, names: tuple[str, ...] = BINARIES) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(stubs.dir / "bin/nvidia-smi", bindir / name)


def _firmware(base: Path, version: str, names: tuple[str, ...] = ("gsp_ga10x.bin",)) -> None:
    for name in names:
        _write(base / "nvidia" / version / name, "stub GSP firmware\n")


def _unix_socket(path: Path) -> None:
    """A UNIX socket file, as a listening daemon leaves it (made by mknod: a bind would be refused for a path
    longer than 107 bytes, as test directories are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFSOCK | 0o755)


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _ldconfig(root: Path) -> None:
    """The linker cache of ``root`` as the installer leaves it (the real ``ldconfig``, no links changed)."""
    (root / "etc").mkdir(exist_ok=True)
    if not (root / "etc/ld.so.conf").exists():
        (root / "etc/ld.so.conf").write_text("")
    subprocess.run(["ldconfig", "-X", "-r", str(root)], check=True, capture_output=True, timeout=60)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cc(*args: object) -> None:
    subprocess.run(["cc", "-O1", *map(str, args)], check=True, capture_output=True, timeout=120)


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def host_glibc() -> tuple[Path, Path]:
    """This machine's (Debian-family) loader and libc, followed to their files."""
    return Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")), Path(os.path.realpath(f"/lib/{ARCH}/libc.so.6"))
