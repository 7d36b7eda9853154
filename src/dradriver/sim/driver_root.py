"""The simulated node's driver root: a directory laid out like an installed NVIDIA driver, with stub files.

Libraries are small text files named as the driver names them (the version in the file name, the soname links
beside them, as ``ldconfig`` leaves them); binaries are shell scripts that print what they are; the GSP firmware
is a stub file too. No file is a real ELF object: the point is that the driver-root discovery and the CDI specs
built from it run unchanged on a simulated node, and that a real container runtime can mount the files.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

#: Versioned driver libraries and the soname each is loaded by (``None``: no soname link is installed).
STUB_LIBRARIES: dict[str, str | None] = {
    "libcuda.so": "libcuda.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libnvidia-opencl.so": "libnvidia-opencl.so.1",
    "libnvidia-cfg.so": "libnvidia-cfg.so.1",
    "libnvidia-gpucomp.so": None,
    "libnvidia-allocator.so": "libnvidia-allocator.so.1",
}
STUB_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
#: The IMEX daemon and its control tool: scripts that run dradriver's IMEX stand-in (``dradriver sim imex``), so a
#: ComputeDomain daemon pod of our image runs the "driver's" IMEX it gets mounted, as on a real node.
STUB_IMEX_BINARIES = {"nvidia-imex": "daemon", "nvidia-imex-ctl": "ctl"}


def write_stub_driver_root(root: Path, version: str, *, machine: str | None = None) -> Path:
    """Create (or refresh) a stub driver root of driver ``version`` at ``root`` and return ``root``.

    Safe to call again on the same directory (a restarted simulated node keeps its root).
    """
    libdir = root / "usr/lib" / f"{machine or platform.machine()}-linux-gnu"
    bindir = root / "usr/bin"
    firmware = root / "lib/firmware/nvidia" / version
    for folder in (libdir, bindir, firmware):
        folder.mkdir(parents=True, exist_ok=True)
    for name, soname in STUB_LIBRARIES.items():
        versioned = f"{name}.{version}"
        _write(libdir / versioned, f"stub {versioned}: simulated NVIDIA driver library\n", mode=0o644)
        if soname is not None:
            _link(libdir / soname, versioned)
    for name in STUB_BINARIES:
        script = f'#!/bin/sh\necho "{name} (simulated NVIDIA driver {version})"\n'
        _write(bindir / name, script, mode=0o755)
    for name, tool in STUB_IMEX_BINARIES.items():
        script = f'#!/bin/sh\n# {name} (simulated NVIDIA driver {version})\nexec dradriver sim imex {tool} "$@"\n'
        _write(bindir / name, script, mode=0o755)
    _write(firmware / "gsp_ga10x.bin", "stub GSP firmware\n", mode=0o644)
    _write(firmware / "gsp_tu10x.bin", "stub GSP firmware\n", mode=0o644)
    return root


def _write(path: Path, text: str, *, mode: int) -> None:
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    path.chmod(mode)


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    path.unlink(missing_ok=True)
    path.symlink_to(target)
