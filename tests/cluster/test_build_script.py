"""scripts/build-control-plane and scripts/build-older-apiservers: where they put the binaries, and that a
complete directory is left alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.control_plane import BINARIES, BUILD_SCRIPT, OLDER_BUILD_SCRIPT


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


def run_older(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(OLDER_BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.parametrize(("release", "version"), [("1.33", "v1.33.5"), ("1.32", "v1.32.9")])
def test_each_older_api_server_has_its_own_directory_beside_the_control_planes(
    tmp_path: Path, release: str, version: str
) -> None:
    override = f"DRADRIVER_APISERVER_{release.replace('.', '')}_DIR"
    env = {k: v for k, v in os.environ.items() if k != override}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    printed = run_older("--print", release, env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == str(tmp_path / "cache" / "dradriver" / "control-plane" / version)
    env[override] = str(tmp_path / "elsewhere")
    assert run_older("--print", release, env=env).stdout.strip() == str(tmp_path / "elsewhere")
    unknown = run_older("--print", "1.31", env=env)
    assert unknown.returncode == 2 and "1.33 1.32" in unknown.stderr


def test_older_api_servers_already_built_for_their_pins_are_not_rebuilt(tmp_path: Path) -> None:
    env = {**os.environ, "GO": "/bin/false"}  # building would fail
    for release in ("1.33", "1.32"):
        target = tmp_path / release
        env[f"DRADRIVER_APISERVER_{release.replace('.', '')}_DIR"] = str(target)
        target.mkdir()
        module = OLDER_BUILD_SCRIPT.parent.parent / "tools" / f"control-plane-{release}"
        stamp = subprocess.run(
            f"cat {module / 'go.mod'} {module / 'go.sum'} | sha256sum | cut -c1-16",
            shell=True, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (target / ".stamp").write_text(stamp)
        (target / "kube-apiserver").write_text("#!/bin/sh\n")
        (target / "kube-apiserver").chmod(0o755)
    done = run_older(env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "1.33"), str(tmp_path / "1.32")]
    assert "building" not in done.stderr
