"""A real container from a claim's CDI spec: an OCI bundle of the kit's bare glibc image, the claim's CDI devices
applied by ``cdi-apply`` (the CDI library container runtimes call, so the edits are a runtime's, not ours), run
by runc. The workloads print their results between markers (workloads/run-workloads.sh), parsed here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.gpu_acceptance.kit import WORKLOAD_DIR, Unpacked

#: The PATH of a plain Debian image: nothing in it points at the driver's files.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SECTION = re.compile(r"^=== BEGIN (\S+)\n(.*?)^=== END \1 rc=(\d+)$", re.MULTILINE | re.DOTALL)
#: containerd's default capabilities.
_CAPABILITIES = [
    f"CAP_{c}"
    for c in (
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    )
]


@dataclass
class Workload:
    """One workload's output in the container: its exit status, text and ``key=value`` lines."""

    rc: int
    output: str
    values: dict[str, str] = field(default_factory=dict)


@dataclass
class ContainerRun:
    """What one container run gave: runc's exit status, its output, the time from ``runc run`` to its exit, the
    workloads' sections, and what cdi-apply put in the spec (or its error)."""

    name: str
    rc: int
    output: str
    seconds: float
    workloads: dict[str, Workload]
    applied: dict[str, Any]
    edits: dict[str, Any]

    @property
    def error(self) -> str:
        """Why the container did not run ('' when it did)."""
        if self.applied.get("error"):
            return f"cdi-apply: {self.applied['error']}"
        if self.rc != 0 and not self.workloads:
            return f"runc run exited {self.rc}: {self.output.strip()[-600:]}"
        return ""


def base_config(args: list[str]) -> dict[str, Any]:
    """An OCI runtime spec as containerd's defaults make one (namespaces, default mounts, no device but runc's
    defaults allowed), running ``args`` as root with the image's PATH."""
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": [f"PATH={IMAGE_PATH}", "HOME=/root"],
            "cwd": "/",
            "capabilities": {k: _CAPABILITIES for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": "gpu-acceptance",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def edits_of(config: dict[str, Any]) -> dict[str, Any]:
    """What the CDI edits left in a spec, in short: environment, device nodes, mounts, hooks."""
    linux = config.get("linux") or {}
    hooks = config.get("hooks") or {}
    base = base_config([])["mounts"]
    return {
        "env": [e for e in config["process"].get("env", []) if not e.startswith(("PATH=", "HOME="))],
        "deviceNodes": [d.get("path") for d in linux.get("devices") or []],
        "mounts": [f"{m.get('source')} -> {m.get('destination')}" for m in config.get("mounts", []) if m not in base],
        "hooks": {
            stage: [" ".join(h.get("args") or [h.get("path", "")]) for h in entries] for stage, entries in hooks.items()
        },
    }


def _text(output: bytes | str | None) -> str:
    """What a timed-out process printed (bytes there, whatever ``text`` said)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def parse_workloads(output: str) -> dict[str, Workload]:
    """The sections of run-workloads.sh's output, by workload name."""
    found = {}
    for match in _SECTION.finditer(output):
        text = match.group(2)
        values = dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Za-z0-9_]+=", line))
        found[match.group(1)] = Workload(int(match.group(3)), text, values)
    return found


@dataclass
class Runtime:
    """runc and cdi-apply from the unpacked kit, with their state and bundles under ``work``."""

    kit: Unpacked
    work: Path

    def _runc(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """runc's answer; one that cannot start (a noexec /tmp) or outlives ``timeout`` is an answer too (126, 124),
        so a check fails saying so and the session goes on to unprepare."""
        # runc is Debian's, linked to libseccomp: the kit carries that library in case the host has none.
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.kit.runc_libs)}
        command = [str(self.kit.runc), "--root", str(self.work / "runc-state"), *args]
        try:
            return subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL
            )
        except OSError as err:
            return subprocess.CompletedProcess(command, 126, "", f"cannot run runc: {err}")
        except subprocess.TimeoutExpired as err:
            output = f"timed out after {timeout} s: {_text(err.stdout)}{_text(err.stderr)}"
            return subprocess.CompletedProcess(command, 124, "", output)

    def bundle(self, name: str, cdi_dir: Path, devices: list[str], args: list[str]) -> tuple[Path, dict[str, Any]]:
        """A fresh bundle (a copy of the image, so one run's linker cache never reaches the next) with the CDI
        devices applied; returns it and cdi-apply's answer."""
        bundle = self.work / "bundles" / name
        if bundle.exists():
            shutil.rmtree(bundle)
        bundle.mkdir(parents=True)
        shutil.copytree(self.kit.rootfs, bundle / "rootfs", symlinks=True)
        config = bundle / "config.json"
        config.write_text(json.dumps(base_config(args), indent=2))
        try:
            done = subprocess.run(
                [str(self.kit.cdi_apply), "-spec-dir", str(cdi_dir), "-config", str(config), *devices],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return bundle, {"error": f"cdi-apply: {err}"}
        try:
            applied: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            applied = {"error": f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-600:]}"}
        return bundle, applied

    def run(
        self, name: str, cdi_dir: Path, devices: list[str], workloads: list[str], *, timeout: float = 90
    ) -> ContainerRun:
        """Run ``workloads`` (names of run-workloads.sh) in a container with the claim's ``devices``."""
        script = f"{WORKLOAD_DIR}/run-workloads.sh"
        bundle, applied = self.bundle(name, cdi_dir, devices, ["/usr/bin/sh", script, *workloads])
        config = json.loads((bundle / "config.json").read_text())
        if applied.get("error"):
            return ContainerRun(name, -1, "", 0.0, {}, applied, edits_of(config))
        started = time.monotonic()
        # The workloads take seconds: a run that takes minutes is stuck (an MPS client waiting on its server).
        done = self._runc("run", "--bundle", str(bundle), name, timeout=timeout)
        rc, output = done.returncode, done.stdout + done.stderr
        if rc == 124:
            self._runc("kill", name, "KILL", timeout=30)
        seconds = time.monotonic() - started
        self._runc("delete", "--force", name, timeout=30)
        shutil.rmtree(bundle, ignore_errors=True)
        return ContainerRun(name, rc, output, seconds, parse_workloads(output), applied, edits_of(config))

    def leftovers(self) -> list[str]:
        """Containers runc still knows of (none should outlive its run)."""
        if not (self.work / "runc-state").exists():
            return []
        done = self._runc("list", "--quiet", timeout=30)
        return [line for line in done.stdout.split() if line]
