"""NVIDIA's ``nvidia-cdi-hook``, shipped in our image and copied to the host, so specs with hooks are the norm.

A CDI hook runs on the host (the runtime executes it before the container starts), so its path in a spec must be
a host path. The image carries the hook; at start the plugin copies it into its plugin directory, which the
DaemonSet mounts at the same path on the host and in the container (``/var/lib/kubelet/plugins/<driver>``), as
NVIDIA's DRA driver does. The copy is atomic (a runtime may run the old one meanwhile) and skipped when the file
there is already the same.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from pathlib import Path

from dradriver.errors import ConfigError

HOOK_NAME = "nvidia-cdi-hook"


def install_cdi_hook(source: Path, directory: Path) -> Path:
    """Copy ``source`` to ``directory/nvidia-cdi-hook`` (mode 0755) unless it is there already; its path."""
    target = directory / HOOK_NAME
    if not source.is_file():
        raise ConfigError(
            f"--cdi-hook-source {source} is not a file: give the image's nvidia-cdi-hook, or 'none' to ship no hook "
            "(--nvidia-cdi-hook-path none makes specs without hooks)"
        )
    try:
        if target.is_file() and filecmp.cmp(source, target, shallow=False) and os.access(target, os.X_OK):
            return target
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{HOOK_NAME}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise ConfigError(
            f"cannot copy nvidia-cdi-hook from {source} to {target}: {err}; make the plugin directory writable "
            "(--plugin-dir) or set --nvidia-cdi-hook-path to a hook already on the host"
        ) from err
    return target
