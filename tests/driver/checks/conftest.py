"""Typed settings for the checks, every path under a test's own directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dradriver.driver.checks.settings import HostSettings


def host(tmp_path: Path, **changes: object) -> HostSettings:
    """A simulated node's host settings (no driver root, no hook), with ``changes``."""
    settings = HostSettings(
        gpu_backend="sim",
        sim_profile="dgx-a100-80gb",
        sim_state=None,
        nvml_library=None,
        driver_root="",
        container_driver_root="",
        dev_dir=tmp_path / "dev",
        plugin_dir=tmp_path / "plugins/gpu.dradriver.dev",
        nvidia_cdi_hook_path="",
        cdi_hook_source="none",
        mig_capabilities=tmp_path / "capabilities",
    )
    return replace(settings, **changes)
