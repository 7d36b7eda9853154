"""MPS control daemons: started with the stand-in, and stopped after a crash whatever the checkpoint knew."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dradriver.driver.mps import MpsControl
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
    mps = MpsControl(mps_standin.command(), tmp_path / "mps", daemon_command=[*wrapper, *mps_standin.command()])
    daemon = mps.start("c1", ["GPU-1"], ["set_default_active_thread_percentage 20"])
    assert marker.read_text().split() == [str(daemon["pid"])]  # the recorded pid is the daemon, started once
    assert mps.query(daemon, "get_default_active_thread_percentage") == "20.0"  # control calls go unwrapped
    assert marker.read_text().split() == [str(daemon["pid"])]
    restarted = MpsControl(mps_standin.command(), tmp_path / "mps", daemon_command=[*wrapper, *mps_standin.command()])
    assert restarted.alive(daemon)  # a new instance finds it serving
    restarted.stop(daemon)
    assert not mps.alive(daemon)
