"""scripts/build-nic-driver-image (the NIC driver's image for the kind backend): where it puts the archive, that an
image is keyed by the binary (built once, rebuilt for another binary), and that the cache keeps the two newest.
podman is a stand-in here that records what it was asked; the kind e2e run loads the real image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.nic_driver import REPO
from test_build_nic_driver import stamp

SCRIPT = REPO / "scripts/build-nic-driver-image"
FAKE_PODMAN = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/podman.log"
case "$1" in
  save) for arg; do [ "$prev" = -o ] && echo archive > "$arg"; prev="$arg"; done ;;
esac
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A stamped stand-in NIC driver binary (build-nic-driver keeps it), a recording podman, a cache of its own."""
    binaries = tmp_path / "nic-driver"
    binaries.mkdir()
    (binaries / "nic-driver").write_text("#!/bin/sh\n# one\n")
    (binaries / "nic-driver").chmod(0o755)
    (binaries / ".stamp").write_text(stamp())
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    return {**os.environ, "DRADRIVER_NIC_DRIVER_DIR": str(binaries), "GO": "/bin/false", "PODMAN": str(podman),
            "DRADRIVER_NIC_DRIVER_IMAGE_DIR": str(tmp_path / "images")}  # fmt: skip


def build(env: dict[str, str], *args: str) -> Path:
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def podman_calls(env: dict[str, str]) -> list[str]:
    log = Path(env["PODMAN"]).with_name("podman.log")
    return log.read_text().splitlines() if log.exists() else []


def test_print_names_the_archive_and_builds_nothing(env: dict[str, str]) -> None:
    printed = build(env, "--print")
    assert printed.parent.parent == Path(env["DRADRIVER_NIC_DRIVER_IMAGE_DIR"])
    assert printed.name == "nic-driver.tar"
    assert not printed.parent.exists()
    assert podman_calls(env) == []
    assert build(env) == printed  # the build lands where --print said


def test_the_image_is_the_binary_alone_named_by_its_key_and_built_once(env: dict[str, str]) -> None:
    archive = build(env)
    key = archive.parent.name
    assert (archive.parent / "image").read_text().strip() == f"localhost/dradriver-nic-driver:{key}"
    imported, saved = podman_calls(env)
    assert imported.startswith('import --change ENTRYPOINT ["/usr/local/bin/nic-driver"] ')
    assert imported.endswith(f" localhost/dradriver-nic-driver:{key}")
    assert saved.startswith("save --format docker-archive -o ")  # what `kind load image-archive` reads
    assert build(env) == archive
    assert len(podman_calls(env)) == 2, "an archive for this binary is not built again"


def test_a_new_binary_is_a_new_image_and_the_two_newest_are_kept(env: dict[str, str]) -> None:
    binary = Path(env["DRADRIVER_NIC_DRIVER_DIR"]) / "nic-driver"
    archives = []
    for build_number in range(3):
        binary.write_text(f"#!/bin/sh\n# build {build_number}\n")
        archives.append(build(env))
        os.utime(archives[-1].parent, (build_number + 1, build_number + 1))  # ls -t's order, not the clock's
    assert len({archive.parent.name for archive in archives}) == 3
    kept = sorted(path.name for path in Path(env["DRADRIVER_NIC_DRIVER_IMAGE_DIR"]).iterdir() if path.is_dir())
    assert kept == sorted(archive.parent.name for archive in archives[1:])
    assert f"rmi -f localhost/dradriver-nic-driver:{archives[0].parent.name}" in podman_calls(env)
