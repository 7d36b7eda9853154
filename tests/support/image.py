"""The plugin image scripts/build-image builds (docs/image.md), for the tests that run it with podman.

Without podman or a built image for the current tree those tests skip, saying what to run; with
``DRADRIVER_REQUIRE_CLUSTER`` set (CI, scripts/test, which builds the image first) they fail."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/dradriver:{VERSION}"
REQUIRE = "DRADRIVER_REQUIRE_CLUSTER"
# podman here: runc (crun refuses this host's hybrid cgroups) and ulimits the sandbox can grant.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
"""


def unavailable(message: str) -> None:
    if os.environ.get(REQUIRE):
        pytest.fail(message)
    pytest.skip(message)


@functools.cache
def archive() -> Path:
    """The OCI archive for the current tree, loaded into podman's store as IMAGE (built only if missing)."""
    if not shutil.which("podman"):
        unavailable("podman is missing: apt-get install podman runc mmdebstrap")
    script = str(REPO / "scripts/build-image")
    printed = subprocess.run([script, "--print"], capture_output=True, text=True, check=True, timeout=60)
    path = Path(printed.stdout.strip())
    if not path.exists():
        unavailable(f"the image for this tree is not built ({path}): run scripts/build-image")
    done = subprocess.run([script], capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr
    return path


def podman(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with a containers.conf this host can run, once the image is there."""
    archive()
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
    )


def podman_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return podman(tmp_path, "run", "--rm", "--network=none", *args)
