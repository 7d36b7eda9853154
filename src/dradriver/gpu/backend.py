"""Choose the GPU backend: real NVML, or NVML running on a simulated node."""

from __future__ import annotations

from pathlib import Path

from dradriver.gpu.interface import GpuLib
from dradriver.gpu.sim import SimulatedNode


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
        from dradriver.gpu.fakelib import simulated_gpulib

        return simulated_gpulib(sim_profile, node_name=node_name, state_path=sim_state)
    raise ValueError(f"unknown GPU backend {backend!r}")
