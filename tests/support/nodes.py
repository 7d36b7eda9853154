"""Simulated nodes for tests: discovery through the real NVML adapter on the fake NVML library."""

from __future__ import annotations

from pathlib import Path

from dradriver.gpu.inventory import Inventory, discover
from dradriver.sim.fakelib import simulated_gpulib


def inventory_of(profile: str, state: Path | None = None, node: str = "sim-node") -> Inventory:
    """The inventory of a simulated node of ``profile`` (NVML opened and closed again)."""
    gpulib, _ = simulated_gpulib(profile, node_name=node, state_path=state)
    try:
        return discover(gpulib)
    finally:
        gpulib.close()
