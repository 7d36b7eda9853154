"""Where the NVIDIA driver's files are, and how a container gets them: the options ``run`` and ``doctor`` share.

``--driver-root`` and ``--container-driver-root`` name the root; ``--nvidia-cdi-hook-path`` and
``--cdi-hook-source`` the hook.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from dradriver.cli.options import add_env_option
from dradriver.gpu.backend import simulated_driver_root
from dradriver.nvidia_install.cdi_hook import HOOK_NAME, install_cdi_hook
from dradriver.nvidia_install.driver_root import DriverRoot, discover_driver_root, find_library
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR

log = logging.getLogger("dradriver.run")


def add_driver_root_options(parser: argparse.ArgumentParser) -> None:
    """Where the NVIDIA driver's files are, for the CDI specs, and the hook."""
    group = parser.add_argument_group("the NVIDIA driver's files (docs/cdi.md)")
    add_env_option(
        group,
        "--driver-root",
        env="DRADRIVER_DRIVER_ROOT",
        default="",
        help="host path of the NVIDIA driver's root: / where the driver is installed on the host (packages, "
        ".run installer, /usr/local/nvidia registered in /etc/ld.so.conf.d), /run/nvidia/driver with the GPU "
        "Operator's driver container, /home/kubernetes/bin/nvidia on GKE; unset: / (a simulated node: a stub root "
        "in the plugin directory; set, the simulated node uses that root too)",
    )
    add_env_option(
        group,
        "--container-driver-root",
        env="DRADRIVER_CONTAINER_DRIVER_ROOT",
        help="where this container mounts --driver-root, e.g. /driver-root (default: the same path)",
    )
    add_env_option(
        group,
        "--nvidia-cdi-hook-path",
        env="DRADRIVER_NVIDIA_CDI_HOOK_PATH",
        default="",
        metavar="PATH|none",
        help="host path of NVIDIA's nvidia-cdi-hook for the create-symlinks, enable-cuda-compat and update-ldcache "
        "hooks, used as given; empty: the copy of --cdi-hook-source, else <driver-root>/usr/bin/nvidia-cdi-hook "
        "if it exists; none: no hooks (the specs work without them)",
    )
    add_env_option(
        group,
        "--cdi-hook-source",
        env="DRADRIVER_CDI_HOOK_SOURCE",
        default="",
        metavar="PATH|none",
        help="nvidia-cdi-hook in this container (the image ships one), copied at start to <plugin-dir>/"
        "nvidia-cdi-hook, a path the host shares, for the specs' hooks; empty: nvidia-cdi-hook on PATH if any; "
        "none: ship no hook (then <driver-root>/usr/bin/nvidia-cdi-hook if it exists)",
    )


def seconds_or_forever(value: str) -> float:
    if value.strip().lower() in ("inf", "infinity", "forever"):
        return float("inf")
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (or 'forever')") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be 0 or more seconds (or 'forever')")
    return seconds


def driver_root_for(args: argparse.Namespace, version: str, *, simulated: bool) -> DriverRoot:
    """Discover the driver root of driver ``version``. A simulated node without ``--driver-root`` gets a stub root
    in the plugin directory, a path the DaemonSet mounts at the same place as on the host, so host and container
    paths agree; with it, the given root is used, so every install layout runs on a simulated node too."""
    hook = cdi_hook_for(args)
    if simulated and not args.driver_root:
        plugin_dir = plugin_dir_of(args)
        plugin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only, as when the plugin creates it
        stub = simulated_driver_root(plugin_dir.absolute() / "sim-driver-root", version)
        return discover_driver_root(host_root=str(stub), version=version, cdi_hook=hook)
    host_root = args.driver_root or "/"
    return discover_driver_root(
        host_root=host_root,
        container_root=args.container_driver_root or host_root,
        version=version,
        cdi_hook=hook,
    )


def cdi_hook_for(args: argparse.Namespace) -> str | None:
    """The hook's host path for the specs: ``--nvidia-cdi-hook-path`` as given (None for ``none``), else the copy
    of the image's hook in the plugin directory, else "" (discovery looks in the driver root)."""
    if args.nvidia_cdi_hook_path == "none":
        return None
    if args.nvidia_cdi_hook_path:
        return str(args.nvidia_cdi_hook_path)
    source = args.cdi_hook_source or shutil.which(HOOK_NAME) or ""
    if not source or source == "none":
        return ""
    return str(install_cdi_hook(Path(source), plugin_dir_of(args).absolute()))


def nvml_library_for(args: argparse.Namespace) -> str | None:
    """Where this process loads NVML from: ``libnvidia-ml.so.1`` found in the driver root as its loader would
    (linker cache, ld.so.conf, the usual directories); None lets pynvml look it up by soname."""
    if args.gpu_backend != "nvml":
        return None
    root = Path(args.container_driver_root or args.driver_root or "/")
    found, how = find_library(root, "libnvidia-ml.so.1")
    if found is None:
        return None
    log.info("loading NVML path=%s found_by=%s", root / found, how)
    return str(root / found)


def plugin_dir_of(args: argparse.Namespace) -> Path:
    return Path(args.plugin_dir) if args.plugin_dir else DEFAULT_PLUGINS_DIR / args.driver_name
