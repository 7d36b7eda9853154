"""What the kit reads from the host it runs on, with the standard library only (it runs before the venv exists):
whether there is a GPU, what ``nvidia-smi`` says of each, the GPUs' compute and MIG modes, MPS processes, mounts.

It never changes anything on the GPU.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Where NVIDIA's tools may live when not on PATH (the lent machines keep the driver in /usr/local/nvidia).
TOOL_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin", "/usr/sbin")
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "driver_version",
    "compute_mode",
    "mig.mode.current",
    "compute_cap",
    # Off, every NVML start on an idle GPU can take seconds: recorded to read the timings by.
    "persistence_mode",
)
MPS_PROGRAMS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "mps_standin")


def find_tool(name: str) -> str | None:
    """``name`` on PATH, else in one of :data:`TOOL_DIRS`."""
    found = shutil.which(name)
    if found:
        return found
    return next((f"{d}/{name}" for d in TOOL_DIRS if os.access(f"{d}/{name}", os.X_OK)), None)


def run_text(command: list[str], *, timeout: float = 30, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit status, stdout and stderr together); 127 when the program is missing, 124 past ``timeout``."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as err:
        return 127, str(err)
    except subprocess.TimeoutExpired as err:
        output = b"".join(o for o in (err.stdout, err.stderr) if isinstance(o, bytes)).decode(errors="replace")
        return 124, f"timed out after {timeout} s: {output}"
    return done.returncode, done.stdout + done.stderr


@dataclass(frozen=True)
class GpuPresence:
    """Whether this machine has an NVIDIA GPU to test, and what says so (or why not)."""

    present: bool
    why: str


def gpu_presence() -> GpuPresence:
    """A GPU is present when ``nvidia-smi -L`` lists one, or when the driver's control device exists (then a
    failing nvidia-smi is a finding, not a reason to skip)."""
    smi = find_tool("nvidia-smi")
    if smi:
        code, text = run_text([smi, "-L"])
        if code == 0 and "GPU " in text:
            return GpuPresence(True, f"{smi} -L: {text.strip().splitlines()[0]}")
    if Path("/dev/nvidiactl").exists():
        return GpuPresence(True, "/dev/nvidiactl exists" + (f" but {smi} -L failed" if smi else ", no nvidia-smi"))
    return GpuPresence(False, "no /dev/nvidiactl" + ("" if smi else " and no nvidia-smi"))


def normalize_bus_id(bus_id: str) -> str:
    """nvidia-smi's ``00000000:1B:00.0`` as NVML's normalised ``0000:1b:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def smi_gpus() -> list[dict[str, str]]:
    """One dict a GPU of nvidia-smi's query fields (a field this nvidia-smi does not know is left out)."""
    smi = find_tool("nvidia-smi")
    if smi is None:
        return []
    fields = list(SMI_FIELDS)
    for _ in range(len(SMI_FIELDS)):
        code, text = run_text([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        if code == 0:
            rows = csv.reader(line for line in text.splitlines() if line.strip())
            return [dict(zip(fields, (v.strip() for v in row), strict=False)) for row in rows]
        unknown = re.search(r'Field "([^"]+)" is not a valid field', text)
        if unknown is None or unknown.group(1) not in fields:
            break
        fields.remove(unknown.group(1))
    return []


def gpu_modes(gpus: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """Per GPU UUID: its compute mode and current MIG mode as nvidia-smi reports them."""
    return {
        g["uuid"]: {"computeMode": g.get("compute_mode", "?"), "migMode": g.get("mig.mode.current", "?")}
        for g in gpus
        if "uuid" in g
    }


def mps_processes(under: Path) -> list[str]:
    """``pid command`` of every running MPS control daemon or server (or the simulator's stand-in) whose pipe
    directory is below ``under``."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={under}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if any(program in command for program in MPS_PROGRAMS) and marker in (entry / "environ").read_bytes():
                found.append(f"{entry.name} {command}")
        except OSError:
            continue
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mounts)."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            found.append(target)
    return found


def cgroup_ready() -> str:
    """'' when a cgroup hierarchy runc can use is mounted, else what is missing."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists() or (root / "devices").is_dir():
        return ""
    return "no cgroup hierarchy at /sys/fs/cgroup (neither cgroup2 nor a v1 devices controller)"


def shipped_library(soname: str) -> str:
    """Where the host's linker cache has ``soname`` ('' when it has none)."""
    ldconfig = find_tool("ldconfig") or "/sbin/ldconfig"
    code, text = run_text([ldconfig, "-p"])
    if code != 0:
        return ""
    for line in text.splitlines():
        if line.strip().startswith(soname + " ") and "=>" in line and "x86-64" in line:
            return line.split("=>")[-1].strip()
    return ""


def tree_hash(root: Path) -> str:
    """A short hash of the Python sources below ``root`` (names and contents): which driver code a report is of,
    where no git history travels."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
