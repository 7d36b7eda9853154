"""The typed inputs of the checks: what a command's flags (or a chart's values) name, already parsed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dradriver.plugin.cluster.transport import Endpoint

#: Where the nvidia module lists the capabilities MIG devices are opened through.
MIG_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")


@dataclass(frozen=True, kw_only=True)
class HostSettings:
    """What the host checks read. Strings are kept as given where a check quotes them back."""

    gpu_backend: str  # "nvml" or "sim"
    sim_profile: str
    sim_state: Path | None
    #: The file NVML is loaded from; None: ``libnvidia-ml.so.1`` by soname through this process's loader.
    nvml_library: str | None
    #: The driver root's host path as given ("" means /).
    driver_root: str
    #: Where this process sees the driver root ("" means the host path).
    container_driver_root: str
    dev_dir: Path
    plugin_dir: Path
    #: ``--nvidia-cdi-hook-path``: the hook's host path as given, "none", or "" to look for one.
    nvidia_cdi_hook_path: str
    #: ``--cdi-hook-source``: the image's hook to copy, "none", or "" for the one on PATH.
    cdi_hook_source: str
    mig_capabilities: Path = MIG_CAPABILITIES

    @property
    def simulated(self) -> bool:
        return self.gpu_backend == "sim"

    @property
    def host_root(self) -> PurePosixPath:
        """The driver root as the host (and so the CDI specs) names it."""
        return PurePosixPath(self.driver_root or "/")

    @property
    def container_root(self) -> Path:
        """The driver root as this process reads it."""
        return Path(self.container_driver_root or self.driver_root or "/")


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """The container runtime's config files and the CDI directory the driver writes its specs to, as given."""

    containerd_config: str
    crio_config: str
    cdi_dir: str


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """How to reach the API server (None: no configuration was found, the checks are skipped), ``source`` where
    that came from (a kubeconfig, the pod's service account); ``mig_mode`` says which feature gates the driver
    needs."""

    endpoint: Endpoint | None
    source: str = ""
    mig_mode: str


#: Where the kubelet keeps its device plugins' registration sockets (``<kubelet --root-dir>/device-plugins``).
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")


@dataclass(frozen=True, kw_only=True)
class DevicePluginSettings:
    """Where NVIDIA's device plugin would show itself: the kubelet's device-plugins directory, and the Node
    (``node_name``; "" when not known, then only the directory is looked at)."""

    device_plugins_dir: Path = DEVICE_PLUGINS_DIR
    node_name: str = ""
