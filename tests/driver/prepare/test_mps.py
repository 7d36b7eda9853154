"""MPS control daemons: started with the stand-in, and stopped after a crash whatever the checkpoint knew."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import required
from support.mps_daemons import may_mount

from dradriver.driver.prepare.mps import MpsControl
from dradriver.errors import DeviceError
from dradriver.sim import mps_standin


class Crash(BaseException):
    """Stands in for SIGKILL of the driver: nothing after it runs."""


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by this test process counts as exited, as on a node after its reaping)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_one_control_call_waits_for_the_daemon_and_applies_its_limits(tmp_path: Path) -> None:
    mps = MpsControl(mps_standin.command(), tmp_path)
    daemon = mps.start("c1", ["GPU-a"], ["set_default_active_thread_percentage 40"])
    try:
        assert mps.query(daemon, "get_default_active_thread_percentage") == "40.0"
        log = (tmp_path / "c1" / "log" / "control.log").read_text()
        assert log.count("Command: get_server_list") == 1  # ready at the first ask, limits in the same call
    finally:
        mps.stop(daemon)
    assert gone(daemon["pid"]) and not (tmp_path / "c1").exists()


def test_a_daemon_that_refuses_a_limit_fails_the_start_at_once_and_is_stopped(tmp_path: Path) -> None:
    mps = MpsControl(mps_standin.command(), tmp_path, ready_timeout_s=30)
    with pytest.raises(DeviceError, match="unknown command 'set_nothing 1'"):
        mps.start("c1", ["GPU-a"], ["set_nothing 1"])
    assert not (tmp_path / "c1").exists()


def test_a_daemon_started_just_before_a_crash_is_stopped_by_the_next_instance(tmp_path: Path) -> None:
    # A daemon that never answers, and a driver killed while it waits: the checkpoint has only the intent (no pid).
    # As a client it finds no daemon (exit 1), as the daemon it never listens.
    silent = [sys.executable, "-c", "import sys, time; sys.exit(1) if '-f' not in sys.argv else time.sleep(120)"]
    first = MpsControl(silent, tmp_path)

    def killed(*_args: object) -> None:
        raise Crash

    first._await_ready = killed  # type: ignore[method-assign]
    with pytest.raises(Crash):
        first.start("c1", ["GPU-a"], [])
    [pid] = first._children
    assert not gone(pid)
    # The next instance undoes the intent: the daemon's directories are all it names.
    pipe, logs = MpsControl(silent, tmp_path).dirs("c1")
    MpsControl(silent, tmp_path).stop({"pipeDir": str(pipe), "logDir": str(logs)})
    assert gone(pid) and not (tmp_path / "c1").exists()
    first._children[pid].wait(10)


def test_a_daemon_command_starts_the_daemon_only_and_its_pid_is_the_daemons(tmp_path: Path) -> None:
    # Like `nsenter … -- systemd-run --scope --` in the DaemonSet: the wrapper does its work, then execs the daemon.
    marker = tmp_path / "wrapped"
    wrapper = [
        sys.executable,
        "-c",
        "import os, sys; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); os.execvp(sys.argv[2], sys.argv[2:])",
        str(marker),
    ]
    mps = MpsControl(mps_standin.command(), tmp_path / "mps", wrapper=wrapper)
    daemon = mps.start("c1", ["GPU-1"], ["set_default_active_thread_percentage 20"])
    assert marker.read_text().split() == [str(daemon["pid"])]  # the recorded pid is the daemon, started once
    assert mps.query(daemon, "get_default_active_thread_percentage") == "20.0"  # control calls go unwrapped
    assert marker.read_text().split() == [str(daemon["pid"])]
    restarted = MpsControl(mps_standin.command(), tmp_path / "mps", wrapper=wrapper)
    assert restarted.alive(daemon)  # a new instance finds it serving
    restarted.stop(daemon)
    assert not mps.alive(daemon)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace."""
    found = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [m for m in found if m == str(path) or m.startswith(f"{path}/")]


def fs_type(path: Path) -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return fields[fields.index("-") + 1]
    return "none"


@pytest.fixture
def mountable() -> None:
    if not may_mount():
        required.need("the right to mount a tmpfs", "a claim's shm directory is one where the plugin may mount",
                      "run as root with CAP_SYS_ADMIN (`scripts/test` as root)")  # fmt: skip


@pytest.mark.usefixtures("mountable")
def test_the_daemons_dev_shm_is_the_claims_size_limited_tmpfs_and_goes_with_it(tmp_path: Path) -> None:
    mps = MpsControl(mps_standin.command(), tmp_path, shm_size=8 * 1024 * 1024)
    daemon = mps.start("c1", ["GPU-a"], [])
    shm = Path(daemon["shmDir"])
    try:
        assert shm == tmp_path / "c1" / "shm" and fs_type(shm) == "tmpfs"
        assert os.statvfs(shm).f_blocks * os.statvfs(shm).f_frsize == 8 * 1024 * 1024
        assert (shm.stat().st_mode & 0o7777) == 0o1777  # as /dev/shm: clients of any user create files there
        # The stand-in wrote its marker into its /dev/shm: the claim's directory, not this machine's /dev/shm.
        assert Path(mps_standin.shm_marker(daemon["pid"], str(shm))).read_text().split() == [str(daemon["pid"])]
        assert not Path(mps_standin.shm_marker(daemon["pid"])).exists()
        # What the daemon sees on its /dev/shm (the last mount there): the claim's tmpfs, with /dev/shm's flags.
        dev_shm = [m.split() for m in Path(f"/proc/{daemon['pid']}/mountinfo").read_text().splitlines()]
        seen = [m for m in dev_shm if m[4] == "/dev/shm"][-1]
        assert {"nosuid", "nodev", "noexec"} <= set(seen[5].split(",")) and seen[seen.index("-") + 1] == "tmpfs"
        assert f"size={8 * 1024}k" in seen[-1]  # the claim's tmpfs, its size
    finally:
        mps.stop(daemon)
    assert gone(daemon["pid"]) and mounts_under(tmp_path) == [] and not (tmp_path / "c1").exists()


@pytest.mark.usefixtures("mountable")
def test_a_restarted_daemon_keeps_its_claims_tmpfs_and_the_next_instance_unmounts_it(tmp_path: Path) -> None:
    mps = MpsControl(mps_standin.command(), tmp_path)
    first = mps.start("c1", ["GPU-a"], [])
    mps.kill(first)
    (Path(first["shmDir"]) / "client-file").write_text("x")  # a client's shared memory, kept across the restart
    second = mps.start("c1", ["GPU-a"], [])
    assert mounts_under(tmp_path) == [second["shmDir"]]  # one tmpfs, not one stacked per start
    assert (Path(second["shmDir"]) / "client-file").exists()
    assert Path(mps_standin.shm_marker(second["pid"], second["shmDir"])).exists()
    MpsControl(mps_standin.command(), tmp_path).stop(second)  # a new instance, after a plugin restart
    assert mounts_under(tmp_path) == [] and not (tmp_path / "c1").exists()


FALLBACK = """
import json, logging, os, sys
from pathlib import Path
from dradriver.driver.prepare.mps import MpsControl
from dradriver.sim import mps_standin
warnings = []
logging.getLogger("dradriver.driver.prepare.mps").addHandler(logging.Handler())
logging.getLogger("dradriver.driver.prepare.mps").handlers[0].emit = lambda r: warnings.append(r.getMessage())
mps = MpsControl(mps_standin.command(), Path(sys.argv[1]))
daemons = [mps.start(uid, ["GPU-a"], []) for uid in ("c1", "c2")]
shm = [d["shmDir"] for d in daemons]
seen = {
    "plain": [os.path.isdir(s) and not os.path.ismount(s) for s in shm],
    "mode": [oct(os.stat(s).st_mode & 0o7777) for s in shm],
    "alive": [mps.alive(d) for d in daemons],
    "warnings": [w for w in warnings if "cannot mount" in w],
}
for d in daemons:
    mps.stop(d)
seen["left"] = os.listdir(sys.argv[1])
print(json.dumps(seen))
"""


def test_without_the_right_to_mount_the_shm_directory_is_a_plain_one_and_says_so_once(tmp_path: Path) -> None:
    # A user namespace of its own: root there, without CAP_SYS_ADMIN over this machine's mounts (as an
    # unprivileged plugin container), so mount() fails with EPERM.
    if shutil.which("unshare") is None:
        required.need("unshare", "the test makes a user namespace of its own", "apt-get install util-linux")
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", FALLBACK, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0 and "unshare failed" in done.stderr:
        required.need("user namespaces", done.stderr.strip(), "a kernel (and container) that allows them")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["plain"] == [True, True] and seen["mode"] == ["0o1777", "0o1777"] and seen["alive"] == [True, True]
    [warning] = seen["warnings"]  # logged once, not per claim
    assert "Operation not permitted" in warning and "run the plugin privileged" in warning
    assert seen["left"] == []


def test_a_daemon_that_cannot_be_executed_leaves_no_directory_and_names_what_is_missing(tmp_path: Path) -> None:
    mps = MpsControl(mps_standin.command(), tmp_path, daemon_command=["/nonexistent/nvidia-cuda-mps-control"])
    with pytest.raises(DeviceError) as raised:
        mps.start("c1", ["GPU-a"], [])
    assert not (tmp_path / "c1").exists()  # no pipe, log or shm directory (nor tmpfs) outlives the failed start
    assert "claim c1" in str(raised.value)


def test_a_failed_restart_keeps_the_directories_a_running_pod_mounts(tmp_path: Path) -> None:
    # A prepared claim's daemon died and cannot be started again: its pods still mount the pipe, log and shm
    # directories (the shm tmpfs is their whole /dev/shm), so only the process goes.
    mps = MpsControl(mps_standin.command(), tmp_path)
    daemon = mps.start("c1", ["GPU-a"], [])
    mps.kill(daemon)
    (tmp_path / "c1" / "shm" / "pod-segment").write_text("in use")
    broken = MpsControl(mps_standin.command(), tmp_path, daemon_command=["/nonexistent/nvidia-cuda-mps-control"])
    with pytest.raises(DeviceError):
        broken.start("c1", ["GPU-a"], [], restart=True)
    assert (tmp_path / "c1" / "shm" / "pod-segment").read_text() == "in use"
    mps.stop(daemon)
    assert not (tmp_path / "c1").exists()


def test_a_tmpfs_that_would_not_reach_the_host_is_found_from_mountinfo(tmp_path: Path) -> None:
    from dradriver.driver.prepare.mps_shm import shared_with_host

    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:40 / /state/mps/c1/shm rw,nosuid,nodev,noexec shared:17 - tmpfs tmpfs rw,size=64k\n"
        "41 22 0:41 / /state/mps/c2/shm rw,nosuid,nodev,noexec - tmpfs tmpfs rw,size=64k\n"
    )
    assert shared_with_host(Path("/state/mps/c1/shm"), info) is True  # a Bidirectional volume's mount
    assert shared_with_host(Path("/state/mps/c2/shm"), info) is False  # private: the host sees the directory
    assert shared_with_host(Path("/state/mps/c3/shm"), info) is None  # no mount there
