"""MPS control daemons on this machine, seen as the node would show them: processes, found through /proc."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import tempfile
from pathlib import Path

from dradriver.driver.prepare import mps_shm


def live_daemons(root: Path) -> dict[str, int]:
    """Claim UID → pid of every live control daemon (a process started with ``-f`` whose pipe directory is
    ``<root>/<claim uid>/pipe``). Exited processes not yet reaped (zombies) are not live."""
    return dict(daemon_processes(root))


def daemon_processes(root: Path) -> list[tuple[str, int]]:
    """(claim UID, pid) of every live control daemon of ``root``, two for a claim if two run."""
    found: list[tuple[str, int]] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            if b"-f" not in (proc / "cmdline").read_bytes().split(b"\0"):
                continue
            env = dict(
                item.split("=", 1)
                for item in (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
            pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/"))
            if pipe.name == "pipe" and pipe.parent.parent == root:
                found.append((pipe.parent.name, int(proc.name)))
    return found


def daemon_dirs(root: Path) -> set[str]:
    """Claim UIDs that have a daemon directory (pipe, log) under ``root``."""
    return {p.name for p in root.iterdir()} if root.exists() else set()


def shm_mounts(root: Path) -> set[str]:
    """Claim UIDs with a mount (their shm tmpfs) under ``root``, in this process's mount namespace."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4])
        if point.is_relative_to(root) and point != root:
            found.add(point.relative_to(root).parts[0])
    return found


def kill_daemons(root: Path) -> None:
    """SIGKILL every live daemon of ``root`` (a test's clean-up after a failure left claims prepared)."""
    for pid in live_daemons(root).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@functools.cache
def may_mount() -> bool:
    """Whether this process may mount a tmpfs (root with CAP_SYS_ADMIN): then a claim's shm directory is one, and
    its daemon's /dev/shm. Tried, not guessed from the uid (root in an unprivileged container may not)."""
    with tempfile.TemporaryDirectory() as scratch:
        probe = Path(scratch) / "shm"
        try:
            mps_shm.make(probe, 1024 * 1024)
        except OSError:
            return False
        mps_shm.remove(probe)
        return True
