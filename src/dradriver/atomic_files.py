"""Atomic replacement of small state files shared by processes, and the sweeping of what a killed writer left.

``storage_fix`` words the remedy for a failed write (a full or read-only filesystem) in every such error.

A writer puts its PID in the temp file's name, so a later reader can tell a write in progress (its writer is alive)
from one a SIGKILL cut short (its writer is gone), and remove only the latter: several processes (the driver, the
`sim` command) may write the same file, and a blind sweep would delete another process's temp file mid-write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


def temp_file_for(path: Path) -> tuple[int, str]:
    """An open temp file beside ``path`` (``fd``, name), named after this process."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: a temp file beside it (named after this process), fsync,
    rename, fsync of the directory (so the rename survives a power loss). Readers see the old or the new file."""
    fd, tmp = temp_file_for(path)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sweep_dead_writers(path: Path, *, writers_locked_out: bool = False) -> list[Path]:
    """Remove the temp files of ``path`` whose writing process no longer exists; return what was removed.

    ``path``'s name may be a glob pattern (``claim_*.json``): the temp files of every file it matches.
    ``writers_locked_out``: the caller holds the lock every writer of ``path`` holds while it writes, so each temp
    file is a killed writer's whatever PID it names (a PID from another PID namespace, or the one a container's
    earlier run had and this process has now, says nothing here)."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid_text = tmp.name.rsplit(".", 3)[-3]  # .<name>.<pid>.<random>.tmp, as temp_file_for names it
        if not pid_text.isdigit() or (not writers_locked_out and _alive(int(pid_text))):
            continue
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def storage_fix(err: OSError, flag: str) -> str:
    """What an operator does about a failed write to the directory ``flag`` names, by the error's cause."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the filesystem of {flag} is full: free space there (the kubelet retries the claim)"
    if err.errno == errno.EROFS:
        return f"the filesystem of {flag} is read-only: remount it read-write or point {flag} at a writable directory"
    return f"check that {flag} exists and is writable"
