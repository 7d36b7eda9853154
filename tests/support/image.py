"""The plugin image scripts/build-image builds (docs/image.md), for the tests that run it with podman.

Without podman or a built image for the current tree those tests skip, saying what to run, or fail where the suite
demands it (support/required.py; scripts/test builds the image first)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

from support import required

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/dradriver:{VERSION}"
# podman here: runc (crun refuses this host's hybrid cgroups) and ulimits the sandbox can grant.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
"""


@functools.cache
def archive() -> Path:
    """The OCI archive for the current tree, loaded into podman's store as IMAGE (built only if missing)."""
    if not shutil.which("podman"):
        required.need("podman", "the image tests run the image with it", "apt-get install podman runc mmdebstrap",
                      tier=required.CLUSTER)  # fmt: skip
    script = str(REPO / "scripts/build-image")
    printed = subprocess.run([script, "--print"], capture_output=True, text=True, check=True, timeout=60)
    path = Path(printed.stdout.strip())
    if not path.exists():
        required.need("the image for this tree", f"nothing at {path}", "run scripts/build-image (`scripts/test` does)",
                      tier=required.CLUSTER)  # fmt: skip
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
