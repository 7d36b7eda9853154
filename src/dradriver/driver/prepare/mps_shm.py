"""The shared memory of a claim's MPS daemon and its clients: one directory that is ``/dev/shm`` for both.

An MPS client and its server meet through the pipe directory's sockets and through POSIX shared memory (files
the server and the clients create in ``/dev/shm``), so both must see one ``/dev/shm``. The daemon runs in the
plugin's container or, with ``--mps-daemon-wrapper``, in the host's mount namespace; each client container has its
pod's own ``/dev/shm``. So each claim gets a directory ``<mps root>/<claim uid>/shm`` beside its pipe and log
directories: a tmpfs when this process may mount (size-limited; a plain directory otherwise, see
:func:`make`), bound on the daemon's ``/dev/shm`` in a mount namespace of its own (:func:`namespace_prefix`), and
mounted on the claim's containers' ``/dev/shm`` by the claim's CDI spec. docs/sharing.md tells why and how.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from pathlib import Path

#: Where a claim's containers and its daemon see the claim's shm directory.
CONTAINER_SHM_DIR = "/dev/shm"
#: The tmpfs size when /proc/meminfo cannot be read (NVIDIA's DRA driver uses the same fallback).
FALLBACK_SIZE = 64 * 1024 * 1024

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_UMOUNT_NOFOLLOW = 8  # never follow a symlink put in the mount point's place
_libc = ctypes.CDLL(None, use_errno=True)


class NoMountPermission(OSError):
    """This process may not mount (no CAP_SYS_ADMIN: an unprivileged container, a test run as a user; or a security
    module refuses it)."""


def default_size(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Half of the node's memory, in bytes: the kernel's default for a tmpfs, and NVIDIA's for this one. It caps
    the tmpfs; pages are used only as the daemon and the clients write them."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_SIZE


def make(path: Path, size: int, *, mount: bool = True) -> bool:
    """Create ``path`` (world-writable with the sticky bit, as ``/dev/shm``: the clients may run as any user) and,
    with ``mount``, mount a tmpfs of ``size`` bytes on it unless one is there (a daemon restarted for its claim
    keeps its own). Whether ``path`` is a tmpfs; :class:`NoMountPermission` when this process may not mount
    (``path`` then stays a plain directory)."""
    path.mkdir(exist_ok=True)
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link; remove it")
    path.chmod(0o1777)
    if os.path.ismount(path):
        return True
    if not mount:
        return False
    options = f"size={size},mode=1777".encode()
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        code = ctypes.get_errno()
        if code in (errno.EPERM, errno.EACCES):  # no CAP_SYS_ADMIN; or a security module's refusal
            raise NoMountPermission(code, f"mounting a tmpfs on {path}: {os.strerror(code)}")
        raise OSError(code, f"mounting a tmpfs on {path}: {os.strerror(code)}")
    return True


def remove(path: Path) -> None:
    """Empty ``path`` and unmount its tmpfs, if any (its directory goes with the claim's). Emptied first: a copy of
    the mount that lingers in another mount namespace then holds no memory."""
    if not path.is_dir() or path.is_symlink():
        return
    for entry in path.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    # Detached: a client's or daemon's open file in it must not make the undo fail; the kernel frees it after them.
    if os.path.ismount(path) and _libc.umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unmounting the tmpfs on {path}: {os.strerror(code)}")


def shared_with_host(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool | None:
    """Whether the mount on ``path`` propagates to peers (a ``shared:`` tag in mountinfo), so that the host and the
    container runtime, which bind it into the clients, see the tmpfs and not the directory under it; None when
    ``path`` is no mount point listed there."""
    target = os.fsencode(os.path.realpath(path))
    try:
        lines = mountinfo.read_bytes().splitlines()
    except OSError:
        return None
    found: bool | None = None
    for line in lines:
        fields = line.split(b" ")
        # id parent major:minor root mount-point options [optional fields...] - fstype source super-options
        if len(fields) > 6 and fields[4].replace(b"\\040", b" ") == target:
            optional = fields[6 : fields.index(b"-")] if b"-" in fields else []
            found = any(f.startswith(b"shared:") for f in optional)  # the last mount on a point is the one seen
    return found


def namespace_prefix(path: Path) -> list[str]:
    """The command to put before the daemon's: a mount namespace of its own where ``path`` is bound on
    ``/dev/shm``, then exec of the daemon (its pid stays the one recorded). Put after ``--mps-daemon-wrapper``,
    whose ``nsenter`` would leave the namespace, and so made by the host's ``unshare`` then, or the image's
    without a wrapper. Slave propagation: the bind stays in the daemon's namespace, while the host's later
    mounts and unmounts (other claims' tmpfs) still reach it, so it holds no copy of them."""
    # A bind takes none of the tmpfs mount's flags: given again (util-linux binds, then remounts with them).
    script = f'mount --bind -o nosuid,nodev,noexec "$1" {CONTAINER_SHM_DIR} && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "mps-shm", str(path)]
