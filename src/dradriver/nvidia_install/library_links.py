"""A directory of the driver's libraries alone, for ``LD_LIBRARY_PATH`` of the driver's own tools started by the
plugin (the MPS control daemon and its server).

The directories the libraries came from are no answer: on most layouts (a Debian, Ubuntu or RHEL host's
``/usr/lib/x86_64-linux-gnu`` or ``/usr/lib64``, the GPU Operator's driver container) they hold that system's C
library too, and a process of this image (its loader, or ``unshare``, ``nsenter`` and ``sh`` started with the same
environment) that loads another glibc's ``libc.so.6`` fails at its first relocation. So the plugin writes symlinks
named as the loader looks the libraries up (each file's name and its soname links) into a directory of its own,
under the state directory: the same path on the host and in the pod, so the host's namespaces (the wrapped MPS
daemon) get a copy whose links point at the host's paths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from dradriver.nvidia_install.driver_root import DriverRoot

#: Below the state directory: ``<version>-container`` and ``<version>-host``.
LINKS_DIR = "driver-libraries"


def library_links(driver_root: DriverRoot, state_dir: Path, *, host: bool) -> Path:
    """The directory of links to ``driver_root``'s libraries, where this process (``host=False``) or the host's
    namespaces (``host=True``) see them; written when missing or different, left alone otherwise (a daemon already
    started keeps reading it)."""
    base = driver_root.host_root if host else PurePosixPath(driver_root.container_root)
    wanted = {file.path.name: str(base / file.path) for file in driver_root.libraries}
    for link in driver_root.symlinks:
        if link.library is not None:
            wanted.setdefault(PurePosixPath(link.link).name, str(base / link.library))
    directory = state_dir / LINKS_DIR / f"{driver_root.version}-{'host' if host else 'container'}"
    if _links_in(directory) == wanted:
        return directory
    # Made aside and renamed into place: two pods of a rolling update (each PID 1 in its container) never share a
    # half-written directory.
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    for name, target in wanted.items():
        (staging / name).symlink_to(target)
    old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
    with contextlib.suppress(FileNotFoundError):
        directory.replace(old / "links")
    staging.chmod(0o755)
    try:
        staging.rename(directory)
    except OSError:
        if _links_in(directory) != wanted:  # not another pod's identical links, written meanwhile
            raise
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def _links_in(directory: Path) -> dict[str, str] | None:
    try:
        return {entry.name: os.readlink(entry) for entry in directory.iterdir()}
    except OSError:
        return None
