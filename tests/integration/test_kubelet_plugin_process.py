"""A plugin process against the kubelet stand-in: register, prepare, refuse a second instance, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kubelet_plugin_fakes import DRIVER, make_claim
from support.short_dirs import short_dir

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, discover

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "kubelet_plugin_process.py"
TIMEOUT = 20.0


@pytest.fixture
def dirs() -> Iterator[Path]:
    with short_dir("dra-") as path:
        (path / "claims.json").write_text(json.dumps([make_claim("a", "uid-a")]))
        yield path


def start(dirs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(dirs / "registry"), str(dirs / "plugin"), str(dirs / "claims.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_plugin_process_serves_refuses_a_twin_and_deregisters_on_sigterm(dirs: Path) -> None:
    first = start(dirs)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "ready"
        with KubeletClient(dirs / "registry").register() as kubelet:
            result = kubelet.prepare([Claim("default", "a", "uid-a"), Claim("default", "gone", "uid-gone")])
            assert result["uid-a"].error == ""
            assert "cannot get claim default/gone" in result["uid-gone"].error

        twin = start(dirs)
        _, err = twin.communicate(timeout=TIMEOUT)
        assert twin.returncode == 2
        assert f"PID {first.pid}" in err and str(dirs / "plugin" / "plugin.lock") in err and DRIVER in err
        # The twin left the running instance's sockets alone.
        assert discover(dirs / "registry") == [dirs / "registry" / f"{DRIVER}-reg.sock"]

        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=TIMEOUT)
        assert first.returncode == 0, err
        assert discover(dirs / "registry") == []
        assert not (dirs / "plugin" / "dra.sock").exists()
        assert err.index("removed registration socket") < err.index("stopped DRA services")
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
