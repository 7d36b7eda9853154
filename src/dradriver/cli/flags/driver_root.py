"""``--driver-root``, ``--container-driver-root``, ``--nvidia-cdi-hook-path``, ``--cdi-hook-source`` and
``--wait-for-driver``: where the NVIDIA driver's files are, how a container gets them, and how long start-up waits
for them (docs/cdi.md)."""

from __future__ import annotations

import argparse
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import seconds_or_forever
from dradriver.errors import ConfigError
from dradriver.gpu.backend import simulated_driver_root
from dradriver.nvidia_install.cdi_hook import HOOK_NAME, install_cdi_hook
from dradriver.nvidia_install.driver_root import DriverRoot, discover_driver_root, find_library

log = logging.getLogger("dradriver.run")

DRIVER_ROOT = EnvFlag(
    flag="--driver-root",
    env="DRADRIVER_DRIVER_ROOT",
    default="",
    help="host path of the NVIDIA driver's root: / where the driver is installed on the host (packages, "
    ".run installer, /usr/local/nvidia registered in /etc/ld.so.conf.d), /run/nvidia/driver with the GPU "
    "Operator's driver container, /home/kubernetes/bin/nvidia on GKE; unset: / (a simulated node: a stub root "
    "in the plugin directory; set, the simulated node uses that root too)",
)
CONTAINER_DRIVER_ROOT = EnvFlag(
    flag="--container-driver-root",
    env="DRADRIVER_CONTAINER_DRIVER_ROOT",
    help="where this container mounts --driver-root, e.g. /driver-root (default: the same path)",
)
NVIDIA_CDI_HOOK_PATH = EnvFlag(
    flag="--nvidia-cdi-hook-path",
    env="DRADRIVER_NVIDIA_CDI_HOOK_PATH",
    default="",
    metavar="PATH|none",
    help="host path of NVIDIA's nvidia-cdi-hook for the create-symlinks, enable-cuda-compat and update-ldcache "
    "hooks, used as given; empty: the copy of --cdi-hook-source, else <driver-root>/usr/bin/nvidia-cdi-hook "
    "if it exists; none: no hooks (the specs work without them)",
)
CDI_HOOK_SOURCE = EnvFlag(
    flag="--cdi-hook-source",
    env="DRADRIVER_CDI_HOOK_SOURCE",
    default="",
    metavar="PATH|none",
    help="nvidia-cdi-hook in this container (the image ships one), copied at start to <plugin-dir>/"
    "nvidia-cdi-hook, a path the host shares, for the specs' hooks; empty: nvidia-cdi-hook on PATH if any; "
    "none: ship no hook (then <driver-root>/usr/bin/nvidia-cdi-hook if it exists)",
)
WAIT_FOR_DRIVER = EnvFlag(
    flag="--wait-for-driver",
    env="DRADRIVER_WAIT_FOR_DRIVER",
    default=float("inf"),
    type=seconds_or_forever,
    metavar="SECONDS",
    help="while NVML or the driver's files are missing (the GPU Operator installs the driver after this pod "
    "starts), wait this long, not ready, logging what is missing every 30 s; 0: fail at once",
)


def add_flags(parser: argparse.ArgumentParser, *, wait: bool = False) -> None:
    """Where the NVIDIA driver's files are, for the CDI specs, and the hook; with ``wait``, how long start-up
    waits for them."""
    group = parser.add_argument_group("the NVIDIA driver's files (docs/cdi.md)")
    for flag in (DRIVER_ROOT, CONTAINER_DRIVER_ROOT, NVIDIA_CDI_HOOK_PATH, CDI_HOOK_SOURCE):
        flag.add(group)
    if wait:
        WAIT_FOR_DRIVER.add(group)


@dataclass(frozen=True, kw_only=True)
class DriverRootOptions:
    """The driver root's host path ("": /), where this container mounts it (None: the same path), the hook's host
    path ("": the image's copy, else the root's; "none": no hooks), the image's hook to copy ("": from PATH;
    "none": none) and how long start-up waits for the driver (seconds; inf: for ever)."""

    driver_root: str = ""
    container_driver_root: str | None = None
    nvidia_cdi_hook_path: str = ""
    cdi_hook_source: str = ""
    wait_for_driver: float = float("inf")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DriverRootOptions:
        return cls(
            driver_root=DRIVER_ROOT.value(args),
            container_driver_root=CONTAINER_DRIVER_ROOT.value(args),
            nvidia_cdi_hook_path=NVIDIA_CDI_HOOK_PATH.value(args),
            cdi_hook_source=CDI_HOOK_SOURCE.value(args),
            wait_for_driver=WAIT_FOR_DRIVER.value(args),
        )

    def check(self) -> None:
        """What no wait for the driver can fix, refused before anything starts: a host path that is not absolute, an
        image hook that is not a file."""
        if self.driver_root and not Path(self.driver_root).is_absolute():
            raise ConfigError(
                f"--driver-root {self.driver_root} is not an absolute path; give the host path, e.g. / or "
                "/run/nvidia/driver"
            )
        if self.nvidia_cdi_hook_path not in ("", "none") and not Path(self.nvidia_cdi_hook_path).is_absolute():
            raise ConfigError(
                f"--nvidia-cdi-hook-path {self.nvidia_cdi_hook_path} is not an absolute path; give the hook's path "
                "on the host, or none for specs without hooks"
            )
        source = self.cdi_hook_source
        if source not in ("", "none") and not Path(source).is_file():
            raise ConfigError(
                f"--cdi-hook-source {source} is not a file: give the image's nvidia-cdi-hook, or 'none' to ship no "
                "hook (--nvidia-cdi-hook-path none makes specs without hooks)"
            )

    def discover(self, version: str, *, simulated: bool, plugin_dir: Path) -> DriverRoot:
        """Discover the driver root of driver ``version``. A simulated node without ``--driver-root`` gets a stub
        root in the plugin directory, a path the DaemonSet mounts at the same place as on the host, so host and
        container paths agree; with it, the given root is used, so every install layout runs on a simulated node
        too."""
        hook = self.cdi_hook(plugin_dir)
        if simulated and not self.driver_root:
            plugin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only, as when the plugin creates it
            stub = simulated_driver_root(plugin_dir.absolute() / "sim-driver-root", version)
            return discover_driver_root(host_root=str(stub), version=version, cdi_hook=hook)
        host_root = self.driver_root or "/"
        return discover_driver_root(
            host_root=host_root,
            container_root=self.container_driver_root or host_root,
            version=version,
            cdi_hook=hook,
        )

    def cdi_hook(self, plugin_dir: Path) -> str | None:
        """The hook's host path for the specs: ``--nvidia-cdi-hook-path`` as given (None for ``none``), else the
        copy of the image's hook in the plugin directory, else "" (discovery looks in the driver root)."""
        if self.nvidia_cdi_hook_path == "none":
            return None
        if self.nvidia_cdi_hook_path:
            return str(self.nvidia_cdi_hook_path)
        source = self.cdi_hook_source or shutil.which(HOOK_NAME) or ""
        if not source or source == "none":
            return ""
        return str(install_cdi_hook(Path(source), plugin_dir.absolute()))

    def nvml_library(self, gpu_backend: str) -> str | None:
        """Where this process loads NVML from: ``libnvidia-ml.so.1`` found in the driver root as its loader would
        (linker cache, ld.so.conf, the usual directories); None lets pynvml look it up by soname (and a simulated
        node needs none)."""
        if gpu_backend != "nvml":
            return None
        root = Path(self.container_driver_root or self.driver_root or "/")
        found, how = find_library(root, "libnvidia-ml.so.1")
        if found is None:
            return None
        log.info("loading NVML path=%s found_by=%s", root / found, how)
        return str(root / found)
