"""scripts/build-control-plane: where it puts the binaries, and that a complete directory is left alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.control_plane import BINARIES, BUILD_SCRIPT


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
