"""The prepared kit: what ``scripts/gpu-acceptance --prepare`` leaves in one ignored folder, and how the GPU
machine unpacks it (no network there).

Layout of the kit folder (default ``.gpu-acceptance/`` in the checkout):

- ``wheels/``: every wheel the checks need for CPython 3.12 on manylinux x86_64 (the runtime dependencies pinned by
  constraints.txt, pytest, pip itself, and dradriver built from this checkout);
- ``payload.tar.xz``: ``bin/`` (runc, NVIDIA's ``nvidia-cdi-hook``, ``cdi-apply``), ``lib/`` (runc's libseccomp),
  ``loaders/`` (the OpenCL ICD loader and glvnd's EGL, for the host baseline), ``rootfs/`` (the container image:
  Debian's glibc, busybox, the loaders, the workloads in ``/opt/gpu-acceptance``);
- ``manifest.json``: what went in, from which package or build, and the sizes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_KIT = REPO / ".gpu-acceptance"
TARGET_PYTHON = "3.12"
WORKLOAD_DIR = "/opt/gpu-acceptance"  # in the container image
WORKLOADS = ("cuda-ptx", "opencl-probe", "egl-probe")


@dataclass(frozen=True)
class Unpacked:
    """The kit unpacked on the machine that runs the checks, under ``root``."""

    root: Path

    @property
    def runc(self) -> Path:
        return self.root / "bin/runc"

    @property
    def hook(self) -> Path:
        return self.root / "bin/nvidia-cdi-hook"

    @property
    def cdi_apply(self) -> Path:
        return self.root / "bin/cdi-apply"

    @property
    def runc_libs(self) -> Path:
        return self.root / "lib"

    @property
    def loaders(self) -> Path:
        return self.root / "loaders"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    def workload(self, name: str) -> Path:
        return self.rootfs / WORKLOAD_DIR.lstrip("/") / name

    def missing(self) -> list[str]:
        paths = [self.runc, self.runc_libs / "libseccomp.so.2", self.hook, self.cdi_apply, self.loaders]
        paths += [self.workload(n) for n in WORKLOADS]
        return [str(p) for p in paths if not p.exists()]


def manifest(kit: Path) -> dict[str, object] | None:
    """The kit's manifest, or None when no kit was prepared there."""
    try:
        loaded = json.loads((kit / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def unpack(kit: Path, dest: Path) -> Unpacked:
    """Unpack ``payload.tar.xz`` into ``dest`` (made afresh)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(kit / "payload.tar.xz") as archive:
        # Our own archive: its device-free tree, symlinks inside it, modes kept.
        archive.extractall(dest, filter="tar")
    return Unpacked(dest)


def venv_python(venv: Path) -> Path:
    return venv / "bin/python"


def interpreter(target: str) -> str | None:
    """A Python of the wheels' version: this one, else ``python<target>`` on PATH; None when there is none."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == target:
        return sys.executable
    return shutil.which(f"python{target}")


def install_venv(kit: Path, venv: Path, target: str, *, timeout: float) -> str:
    """A virtual environment at ``venv`` with every wheel of the kit, installed offline; returns what failed, or ''.

    The venv is made without pip (the interpreter may have no ensurepip) and pip runs from its own wheel, told to
    read no configuration of the machine's (a pip.conf or PIP_* variable asking for an index, hashes or --user)."""
    wheels = sorted((kit / "wheels").glob("*.whl"))
    pip = next((w for w in wheels if w.name.startswith("pip-")), None)
    if pip is None:
        return f"no pip wheel in {kit / 'wheels'}: run scripts/gpu-acceptance --prepare"
    python = interpreter(target)
    if python is None:
        return (
            f"the kit's wheels are for Python {target}; this machine has {sys.version.split()[0]} and no python{target}"
        )
    pip_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    pip_env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}
    others = [str(w) for w in wheels if w != pip]
    pip_install = [str(venv_python(venv)), f"{pip}/pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir"]
    steps = (
        ("python -m venv", [python, "-m", "venv", "--without-pip", "--clear", str(venv)], None),
        ("pip install from the wheelhouse", [*pip_install, "--disable-pip-version-check", str(pip), *others], pip_env),
    )
    for what, command, env in steps:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{what}: {err}"
        if done.returncode != 0:
            return f"{what}: {done.stderr.strip()[-800:]}"
    return ""
