"""Choose the GPU backend: real NVML, or NVML running on a simulated node.

This factory is the one door from production code to the simulator (``dradriver.sim``); the import contracts in
pyproject.toml hold every other module to it. The simulator is imported only when a simulated backend is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.gpu.interface import GpuLib

if TYPE_CHECKING:
    from typing import TypeAlias

    from dradriver.gpu.fabric_manager import FabricManager
    from dradriver.sim.node import SimulatedNode
    from dradriver.sim.sysfs import SimKernel

    #: What :func:`open_gpu_backend` returns, for callers that may not name the simulator (a type only).
    OpenedBackend: TypeAlias = tuple[GpuLib, SimulatedNode | None]


def open_gpu_backend(
    backend: str,
    *,
    sim_profile: str,
    sim_state: Path | None = None,
    node_name: str = "sim-node",
    nvml_library: str | None = None,
) -> tuple[GpuLib, SimulatedNode | None]:
    """A ``GpuLib`` for ``backend`` ("nvml" or "sim"), and the simulated node behind it when simulated.

    Both run the same NVML adapter; "sim" loads it over our fake NVML library instead of libnvidia-ml.
    ``nvml_library``: the file to load NVML from (default: ``libnvidia-ml.so.1`` through the loader).
    """
    if backend == "nvml":
        from dradriver.gpu.nvml import NvmlGpuLib

        return NvmlGpuLib(library_path=nvml_library), None
    if backend == "sim":
        from dradriver.sim.fakelib import simulated_gpulib

        return simulated_gpulib(sim_profile, node_name=node_name, state_path=sim_state)
    raise ValueError(f"unknown GPU backend {backend!r}")


def sim_profile_name(sim_profile: str) -> str:
    """The ``name`` of a simulated node profile (built-in name or file path); ``ConfigError`` if it is invalid."""
    from dradriver.sim.profiles import load_node_profile

    return load_node_profile(sim_profile).name


def simulated_driver_root(directory: Path, driver_version: str) -> Path:
    """Write the stub driver root of a simulated node (libraries, binaries, firmware of ``driver_version``)."""
    from dradriver.sim.driver_root import write_stub_driver_root

    return write_stub_driver_root(directory, driver_version)


def attach_simulated_sysfs(node: SimulatedNode, host_root: Path) -> SimKernel:
    """Give a simulated node its sysfs and ``/dev/vfio`` under ``host_root`` (written once: the bindings outlive a
    driver process); returns the writer that answers for its kernel (VFIO passthrough)."""
    return node.attach_sysfs(host_root)


def simulated_proc_root(directory: Path) -> Path:
    """Write the ``/proc`` files a simulated multi-node NVLink node shows (devices, IMEX capability) there."""
    from dradriver.sim.fabric import write_fake_proc

    return write_fake_proc(directory)


def simulated_imex_commands() -> tuple[list[str], list[str]]:
    """The command lines of the IMEX daemon and control tool stand-ins that serve simulated nodes."""
    from dradriver.sim import imex_standin

    return imex_standin.command(), imex_standin.ctl_command()


def simulated_mps_command() -> list[str]:
    """The command line of the MPS control stand-in that serves a simulated node."""
    from dradriver.sim import mps_standin

    return mps_standin.command()


def simulated_fabric_manager(node: SimulatedNode) -> FabricManager:
    """Fabric Manager's stand-in on a simulated NVSwitch node (shared-NVSwitch partitions, their activation kept
    beside the node's state file); ``FabricManagerError`` when the node has no NVSwitch fabric."""
    from dradriver.sim.fabric_manager import SimFabricManager

    return SimFabricManager.beside(node)
