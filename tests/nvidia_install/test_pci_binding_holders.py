"""Who holds a GPU's device nodes open, read from a ``/proc`` tree as ``fuser`` reads it; a ``/proc`` that cannot
tell is refused, never taken for "nobody"."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.nvidia_install.pci_binding import HoldersUnknown, HostPci, NodeRef, processes_holding

NOBODY = 65534


def process(proc: Path, pid: int, command: str, *targets: str) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(f"{command}\n")
    for fd, target in enumerate(targets, start=3):
        os.symlink(target, proc / str(pid) / "fd" / str(fd))  # /proc's links name paths that need not exist here


def test_any_path_ending_in_the_node_counts_and_no_other_minor_does(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    process(proc, 40, "nvidia-smi", "/dev/nvidiactl", "/dev/nvidia1")
    process(proc, 7, "dcgm", "/run/nvidia/driver/dev/nvidia1")  # beside a containerised driver
    process(proc, 12, "trainer", "/dev/nvidia10", "socket:[123]")  # another GPU, and not a file at all
    (proc / "self").mkdir()  # not a PID
    (proc / "55").mkdir()  # a process that just ended: its fd directory is gone
    holders = processes_holding(proc, [NodeRef("/dev/nvidia1")])
    assert [(h.pid, h.command, h.path, h.node) for h in holders] == [
        (7, "dcgm", "/run/nvidia/driver/dev/nvidia1", "/dev/nvidia1"),
        (40, "nvidia-smi", "/dev/nvidia1", "/dev/nvidia1"),
    ]


def test_the_host_roots_proc_is_read(tmp_path: Path) -> None:
    process(tmp_path / "proc", 1, "init")
    assert HostPci(tmp_path).device_node_holders(0) == []
    process(tmp_path / "proc", 99, "monitor", "/dev/nvidia0")
    assert [h.pid for h in HostPci(tmp_path).device_node_holders(0)] == [99]


@pytest.mark.parametrize("mounted", [False, True])
def test_a_proc_not_mounted_where_the_driver_reads_it_is_refused_naming_the_mount(
    tmp_path: Path, mounted: bool
) -> None:
    if mounted:
        (tmp_path / "proc").mkdir()  # the mount point is there, nothing mounted on it
    pci = HostPci(tmp_path)
    with pytest.raises(HoldersUnknown, match=r"mount the host's /proc .*/host/proc"):
        pci.gpu_node_holders("0000:1b:00.0", 0)
    assert not pci.proc_listable()


def test_a_node_is_matched_by_its_device_number_whatever_its_path(tmp_path: Path) -> None:
    # /dev/null stands for the GPU's node: this host's /proc/devices says its major (1) is nvidia-frontend. A
    # container that names the node otherwise, or a node deleted since it was opened, still leads to that number.
    null = os.stat("/dev/null").st_rdev
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(f"Character devices:\n{os.major(null)} nvidia-frontend\n")
    process(tmp_path / "proc", 31, "renamed", "/dev/null")
    process(tmp_path / "proc", 32, "other-minor", "/dev/zero")
    process(tmp_path / "proc", 33, "gone", "/nowhere/dev/nvidia3")  # no device here: matched by its path
    holders = HostPci(tmp_path).device_node_holders(os.minor(null))
    assert [(h.pid, h.node) for h in holders] == [(31, f"/dev/nvidia{os.minor(null)}"), (33, "/dev/nvidia3")]


def test_the_gpus_dri_nodes_count_as_its_device_nodes(tmp_path: Path) -> None:
    drm = tmp_path / "sys/bus/pci/devices/0000:1b:00.0/drm"
    for name, dev in (("card1", "226:1"), ("renderD129", "226:129")):
        (drm / name).mkdir(parents=True)
        (drm / name / "dev").write_text(f"{dev}\n")
    process(tmp_path / "proc", 1, "init")
    process(tmp_path / "proc", 80, "Xorg", "/dev/dri/card1")
    process(tmp_path / "proc", 81, "ffmpeg", "/dev/dri/renderD129")
    process(tmp_path / "proc", 82, "other-gpu", "/dev/dri/renderD130")
    holders = HostPci(tmp_path).gpu_node_holders("0000:1b:00.0", 0)
    assert [(h.pid, h.node) for h in holders] == [(80, "/dev/dri/card1"), (81, "/dev/dri/renderD129")]


def test_the_live_minor_is_the_nvidia_drivers_own(tmp_path: Path) -> None:
    pci = HostPci(tmp_path)
    assert pci.live_minor("0000:1B:00.0") is None  # no /proc/driver/nvidia here: the caller falls back to NVML's
    information = tmp_path / "proc/driver/nvidia/gpus/0000:1b:00.0/information"
    information.parent.mkdir(parents=True)
    information.write_text("Model: \t\t NVIDIA H100\nBus Location: \t 0000:1b:00.0\nDevice Minor: \t 5\n")
    assert pci.live_minor("0000:1B:00.0") == 5


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are the owner's only)."""
    made = Path(tempfile.mkdtemp(prefix="dradriver-proc-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def test_a_process_whose_fds_cannot_be_read_is_refused_naming_it(shared_dir: Path) -> None:
    # /proc/<pid>/fd of another user's process is not readable without CAP_SYS_PTRACE: that process may hold the
    # GPU, so the scan says whom it could not read instead of skipping it as if it had ended.
    proc = shared_dir / "proc"
    process(proc, 1, "init")
    process(proc, 4711, "secret", "/dev/nvidia0")
    process(proc, 4712, "secret-too")
    for pid in (4711, 4712):
        (proc / str(pid) / "fd").chmod(0o500)  # the owner's (root's) only
    assert scan_unprivileged(shared_dir) == (
        "(4711, 4712) the open files of processes 4711, 4712 under "
        f"{proc} cannot be read, so whether they hold the GPU is unknown; run the driver with CAP_SYS_PTRACE "
        "(privileged, as the chart does)"
    )


def scan_unprivileged(root: Path) -> str:
    """What ``device_node_holders(0)`` under ``root`` raises for a user who cannot read root's ``fd`` directories:
    this process when it is not root, else a child of it that gave root up (nobody), as a plugin without
    CAP_SYS_PTRACE is."""

    def scan() -> str:
        try:
            HostPci(root).device_node_holders(0)
        except HoldersUnknown as err:
            return f"{err.pids} {err}"
        return "no error"

    if os.geteuid() != 0:
        return scan()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, scan().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    os.waitpid(child, 0)
    return said


def test_links_to_files_are_never_followed_and_a_device_link_that_cannot_be_is_matched_by_its_path(
    tmp_path: Path,
) -> None:
    # stat of a file on a dead NFS or FUSE mount can block for good, and an unrelated fd's ESTALE, EIO or EACCES must
    # not make its process unreadable: only links under /dev/ or deleted are followed, and a failure is no number.
    loop = tmp_path / "stale"
    loop.symlink_to(loop)  # stat fails (ELOOP) as on a stale mount; a test cannot make it hang
    deleted = tmp_path / "nvidia4 (deleted)"
    deleted.symlink_to(deleted)
    proc = tmp_path / "proc"
    process(proc, 1, "init")
    process(proc, 60, "nfs-reader", str(loop), "/dev/nvidia4")
    process(proc, 61, "left-a-deleted-node", str(deleted))
    holders = processes_holding(proc, [NodeRef("/dev/nvidia4", os.makedev(195, 4))])
    assert [(h.pid, h.path) for h in holders] == [(60, "/dev/nvidia4")]


def test_a_containers_own_proc_is_refused_naming_the_mount(tmp_path: Path) -> None:
    # Without the host-proc volume a pod without hostPID reads its own /proc: its processes only.
    process(tmp_path / "proc", 1, "pause")
    (tmp_path / "proc/1/ns").mkdir()
    (tmp_path / "proc/1/ns/pid").symlink_to("pid:[4026532417]")
    pci = HostPci(tmp_path)
    assert not pci.proc_listable()
    with pytest.raises(HoldersUnknown, match=r"a container's own /proc.*mount the host's /proc .*/host/proc"):
        pci.gpu_node_holders("0000:1b:00.0", 0)
    (tmp_path / "proc/1/ns/pid").unlink()
    (tmp_path / "proc/1/ns/pid").symlink_to("pid:[4026531836]")  # the host's initial PID namespace
    assert pci.proc_listable() and pci.gpu_node_holders("0000:1b:00.0", 0) == []
