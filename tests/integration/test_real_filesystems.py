"""A really full (tmpfs with a size) and a really read-only (a read-only bind mount) state or CDI directory, as
on a node: the claim fails with an error naming the path, the cause and the fix, nothing is half-written, and the
re-sent prepare succeeds once space returns or the directory is read-write again.
(tests/driver/prepare/test_state_mig.py raises the same errors through a seam at every write; this is the kernel
raising them.) Needs root and mount: skipped, with the reason, where either is missing, or failed where the suite
demands them (support/required.py)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import required

from dradriver.cli.flags.values import check_writable_dir
from dradriver.errors import ConfigError
from tests.driver.prepare.test_state_mig import H100, Node, claim, ref

MOUNT = shutil.which("mount")


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")


class Mounts:
    """Mounts made for one test, undone in reverse at its end."""

    def __init__(self) -> None:
        self.points: list[Path] = []

    def tmpfs(self, where: Path, size: str) -> None:
        self._mount(where, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))

    def bind(self, where: Path) -> None:
        self._mount(where, "--bind", str(where), str(where))

    def _mount(self, where: Path, *arguments: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or MOUNT is None:
            required.need("root and mount(8)", "these tests mount real filesystems", "run as root (`scripts/test` is)")
        try:
            _run(MOUNT, *arguments)
        except OSError as err:
            required.need("the right to mount", str(err), "run as root with CAP_SYS_ADMIN (a privileged container)")
        self.points.append(where)

    @staticmethod
    def remount(where: Path, mode: str) -> None:
        assert MOUNT is not None
        _run(MOUNT, "-o", f"remount,{mode},bind", str(where))

    def undo(self) -> None:
        for point in reversed(self.points):
            subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


@pytest.fixture
def mounts() -> Iterator[Mounts]:
    made = Mounts()
    yield made
    made.undo()


def fill(directory: Path) -> Path:
    """Write into ``directory`` until its filesystem answers ENOSPC; returns the file that holds the space."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def node_on(tmp_path: Path, mounts: Mounts, where: str, kind: str) -> tuple[Node, Path]:
    """A node whose ``where`` directory (state or cdi) is its own filesystem; returns the node and the directory."""
    directory = tmp_path / where
    if kind == "full":
        mounts.tmpfs(directory, "512k")
    else:
        mounts.bind(directory)
    node = Node(tmp_path, "hgx-h100-80gb")
    node.cdi_dir.mkdir(exist_ok=True)
    return node, directory


ERRORS = {"full": "No space left on device", "read-only": "Read-only file system"}


@pytest.mark.parametrize(
    ("kind", "where"),
    # A state directory cannot turn read-only under a running driver by remount (the checkpoint's lock file is
    # open for writing, so the kernel answers "busy"); the start-up check below covers it.
    [("full", "state"), ("full", "cdi"), ("read-only", "cdi")],
)
def test_a_really_full_or_read_only_directory_fails_the_claim_cleanly_and_the_retry_succeeds_after(
    tmp_path: Path, mounts: Mounts, kind: str, where: str
) -> None:
    node, directory = node_on(tmp_path, mounts, where, kind)
    try:
        assert node.prepare(claim("kept", "gpu-0000-43-00-0"))[1] is None  # the checkpoint has something to lose
        checkpoint = node.state_dir / "checkpoint.json"
        before, specs_before = checkpoint.read_bytes(), node.cdi_files()
        filler = fill(directory) if kind == "full" else None
        if kind == "read-only":
            mounts.remount(directory, "ro")
        device = f"{H100}-mig-1g10gb-0"
        _, error = node.prepare(claim("u1", device))
        assert error is not None and ERRORS[kind] in error and f"--{where}-dir" in error, error
        assert node.instances() == [] and node.cdi_files() == specs_before  # the carved partition destroyed
        assert not list(node.state_dir.glob(".*.tmp")) and not list(node.cdi_dir.glob(".*.tmp"))
        assert checkpoint.read_bytes() == before
        assert [r.uid for r in node.driver.checkpoint.records()] == ["kept"]

        if filler is not None:
            filler.unlink()  # space returns
        else:
            mounts.remount(directory, "rw")
        ids, error = node.prepare(claim("u1", device))
        assert error is None and ids == [f"k8s.gpu.dradriver.dev/claim=u1-{device}"]
        assert node.driver.unprepare_resource_claims([ref("u1"), ref("kept")]) == {"u1": None, "kept": None}
        node.assert_clean()
    finally:
        assert node.store is not None
        node.store.close()


def test_a_read_only_state_directory_is_refused_at_start_naming_the_mount(tmp_path: Path, mounts: Mounts) -> None:
    state = tmp_path / "state"
    mounts.bind(state)
    mounts.remount(state, "ro")
    with pytest.raises(ConfigError, match=r"--state-dir .* is on a read-only filesystem; mount it read-write"):
        check_writable_dir("--state-dir", state / "sub")
