"""The IMEX stand-in (sim/imex_standin.py) as a daemon serves on whatever its clients do, as the real one does: the
ComputeDomain daemon asks it every poll through a ctl whose caller may kill it on a timeout, and a stand-in that
died of that, or waited on one silent client, read as IMEX down (CI saw the daemon restart it and its node table
come back empty)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.sim import imex_standin


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    control = tmp_path / "imex_ctrl.sock"
    nodes = tmp_path / "nodes.cfg"
    nodes.write_text("127.0.0.1\n")
    config = tmp_path / "config.cfg"
    config.write_text(
        "SERVER_PORT=0\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\nIMEX_CMD_PORT=0\nIMEX_CMD_ENABLED=1\n"
        f"IMEX_CMD_UNIX_DOMAIN_PATH={control}\nIMEX_NODE_CONFIG_FILE={nodes}\n"
    )
    process = subprocess.Popen([*imex_standin.command(), "-c", str(config)])
    try:
        deadline = time.monotonic() + 10
        while not control.exists():
            assert time.monotonic() < deadline, "the IMEX stand-in did not open its control socket"
            time.sleep(0.05)
        yield process, control
    finally:
        process.terminate()
        process.wait(10)


def _ready(control: Path) -> bool:
    done = subprocess.run(
        [*imex_standin.ctl_command(), "-q", f"--u={control}"], capture_output=True, text=True, timeout=10, check=False
    )
    return done.returncode == 0 and done.stdout == "READY\n"


def test_a_client_that_never_asks_or_hangs_up_first_neither_holds_up_nor_ends_the_daemon(
    daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, control = daemon
    assert _ready(control)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(control))  # connected, never asking: the next client is answered all the same
        for _ in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
                gone.connect(str(control))  # hangs up before its answer is written (a ctl killed by a timeout)
        assert _ready(control)
    assert process.poll() is None
    assert _ready(control)
