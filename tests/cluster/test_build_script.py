"""scripts/build-control-plane and scripts/build-apiserver-1.33: where they put the binaries, and that a complete
directory is left alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.control_plane import BINARIES, BUILD_SCRIPT, BUILD_SCRIPT_133


def run_script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_the_directory_is_per_release_under_the_user_cache_unless_overridden(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRADRIVER_CONTROL_PLANE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    printed = run_script("--print", env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == str(tmp_path / "cache" / "dradriver" / "control-plane" / "v1.37.2")
    env["DRADRIVER_CONTROL_PLANE_DIR"] = str(tmp_path / "elsewhere")
    assert run_script("--print", env=env).stdout.strip() == str(tmp_path / "elsewhere")


def test_binaries_already_built_for_the_pin_are_not_rebuilt(tmp_path: Path) -> None:
    target = tmp_path / "bin"
    env = {**os.environ, "DRADRIVER_CONTROL_PLANE_DIR": str(target), "GO": "/bin/false"}  # building would fail
    target.mkdir()
    module = BUILD_SCRIPT.parent.parent / "tools" / "control-plane"
    stamp = subprocess.run(
        f"cat {module / 'go.mod'} {module / 'go.sum'} | sha256sum | cut -c1-16",
        shell=True, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (target / ".stamp").write_text(stamp)
    for name in BINARIES:
        (target / name).write_text("#!/bin/sh\n")
        (target / name).chmod(0o755)
    done = run_script(env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    assert "building" not in done.stderr


def run_133(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT_133), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_the_1_33_api_server_has_its_own_directory_beside_the_control_planes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRADRIVER_APISERVER_133_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    printed = run_133("--print", env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == str(tmp_path / "cache" / "dradriver" / "control-plane" / "v1.33.5")
    env["DRADRIVER_APISERVER_133_DIR"] = str(tmp_path / "elsewhere")
    assert run_133("--print", env=env).stdout.strip() == str(tmp_path / "elsewhere")


def test_a_1_33_api_server_already_built_for_the_pin_is_not_rebuilt(tmp_path: Path) -> None:
    target = tmp_path / "bin"
    env = {**os.environ, "DRADRIVER_APISERVER_133_DIR": str(target), "GO": "/bin/false"}  # building would fail
    target.mkdir()
    module = BUILD_SCRIPT_133.parent.parent / "tools" / "control-plane-1.33"
    stamp = subprocess.run(
        f"cat {module / 'go.mod'} {module / 'go.sum'} | sha256sum | cut -c1-16",
        shell=True, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (target / ".stamp").write_text(stamp)
    (target / "kube-apiserver").write_text("#!/bin/sh\n")
    (target / "kube-apiserver").chmod(0o755)
    done = run_133(env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target)
    assert "building" not in done.stderr
