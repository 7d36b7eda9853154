"""scripts/build-nic-driver (the topology recipe's second DRA driver): where it puts the binary, that a binary
stamped for these sources is left alone, and that one for other sources is rebuilt (here with a Go that fails,
so the failure shows the rebuild was tried, and nothing half-built is left)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.nic_driver import BUILD_SCRIPT

SOURCES = BUILD_SCRIPT.parent.parent / "tools" / "nic-driver"


def run_script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def stamp() -> str:
    # Its sources, pins and the script itself (its flags): as the script stamps what it built.
    parts = [SOURCES / "go.mod", SOURCES / "go.sum", *sorted(SOURCES.glob("*.go")), BUILD_SCRIPT]
    files = " ".join(str(p) for p in parts)
    done = subprocess.run(f"cat {files} | sha256sum | cut -c1-16", shell=True, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout


def test_the_binary_is_per_release_under_the_user_cache_unless_overridden(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRADRIVER_NIC_DRIVER_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    printed = run_script("--print", env=env)
    assert printed.returncode == 0, printed.stderr
    # The release of k8s.io/dynamic-resource-allocation the module pins: the node's.
    assert printed.stdout.strip() == str(tmp_path / "cache/dradriver/nic-driver/v0.37.2/nic-driver")
    env["DRADRIVER_NIC_DRIVER_DIR"] = str(tmp_path / "elsewhere")
    assert run_script("--print", env=env).stdout.strip() == str(tmp_path / "elsewhere/nic-driver")


def test_a_binary_stamped_for_these_sources_is_not_rebuilt(tmp_path: Path) -> None:
    env = {**os.environ, "DRADRIVER_NIC_DRIVER_DIR": str(tmp_path), "GO": "/bin/false"}  # building would fail
    binary = tmp_path / "nic-driver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / ".stamp").write_text(stamp())
    done = run_script(env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(binary)
    assert binary.read_text() == "#!/bin/sh\n"


def test_a_binary_for_other_sources_is_rebuilt(tmp_path: Path) -> None:
    env = {**os.environ, "DRADRIVER_NIC_DRIVER_DIR": str(tmp_path), "GO": "/bin/false"}
    binary = tmp_path / "nic-driver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / ".stamp").write_text("0000000000000000\n")
    done = run_script(env=env)
    assert done.returncode == 1, done.stdout
    assert "the build failed" in done.stderr
    assert not binary.exists()
    assert not list(tmp_path.glob(".build.*")), "the staging directory is removed"
