"""NVIDIA's ``nvidia-cdi-hook``, shipped in our image and copied to the host, so specs with hooks are the norm.

A CDI hook runs on the host (the runtime executes it before the container starts), so its path in a spec must be
a host path. The image carries the hook; at start the plugin copies it into its plugin directory, which the
DaemonSet mounts at the same path on the host and in the container (``/var/lib/kubelet/plugins/<driver>``), as
NVIDIA's DRA driver does. The copy is atomic (a runtime may run the old one meanwhile) and skipped when the file
there is already the same.

Which subcommands a hook has depends on its release (``update-application-profile`` came with 1.20.0), and a spec
naming one the hook lacks fails every container it is given to: :func:`hook_version` asks the hook, and the spec
names a newer subcommand only where the answer allows it.
"""

from __future__ import annotations

import filecmp
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from dradriver.errors import ConfigError

HOOK_NAME = "nvidia-cdi-hook"
# `nvidia-cdi-hook --version`: "NVIDIA CDI Hook version 1.20.2"; `nvidia-ctk --version`: "… CLI version 1.20.2".
_VERSION = re.compile(r"\bversion v?(\d+\.\d+\.\d+)")


def hook_version(path: Path) -> str | None:
    """The release ``path --version`` reports (``1.20.2``); None when it is not an executable file here or does not
    say. Asked once per file (its size and time of change)."""
    try:
        info = path.stat()
    except OSError:
        return None
    if not path.is_file() or not os.access(path, os.X_OK):
        return None
    return _asked_version(str(path), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _asked_version(path: str, _size: int, _mtime_ns: int) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(done.stdout) if done.returncode == 0 else None
    return match.group(1) if match else None


def hook_at_least(version: str | None, wanted: tuple[int, int, int]) -> bool:
    """Whether a hook of ``version`` (None: unknown) is ``wanted`` or newer."""
    if version is None:
        return False
    return tuple(int(part) for part in version.split(".")) >= wanted


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
