"""The NIC driver's stand-in sysfs on kind (nic_driver_kind.py): the script its DaemonSet's init container runs
writes, with busybox's shell and applets, the very tree the local node's NIC driver reads
(support.nic_driver.write_sysfs), so the NICs sit on the same PCIe roots and NUMA nodes on either backend. Needs
no cluster; the kind run of scenario 10 runs the script in the pod."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from nic_driver_kind import sysfs_script
from support import required
from support.nic_driver import write_sysfs


def tree(root: Path) -> list[tuple[str, str]]:
    """Every entry under ``root``: a directory, a file's content or a link's target."""
    entries = []
    for directory, subdirs, files in os.walk(root):
        for name in subdirs + files:
            path = Path(directory) / name
            kind = f"-> {os.readlink(path)}" if path.is_symlink() else path.read_text() if path.is_file() else "dir/"
            entries.append((str(path.relative_to(root)), kind))
    return sorted(entries)


def test_the_init_container_writes_the_local_nodes_stand_in_sysfs(tmp_path: Path) -> None:
    busybox = shutil.which("busybox")
    if busybox is None:
        required.need("busybox", "the NIC driver's init container runs busybox", "install busybox-static")
    written = tmp_path / "pod"
    written.mkdir()
    script = sysfs_script(mount=str(written))
    # The image's PATH holds only busybox's sh (and a few links): the script calls the other applets through it.
    done = subprocess.run([busybox, "sh", "-euc", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    expected = write_sysfs(tmp_path / "local")
    assert tree(written) == tree(expected)
    assert any(name.startswith("class/net/") for name, _ in tree(written))
