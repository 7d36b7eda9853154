"""The driver-root checks called directly: a stub driver root passes; a missing libcuda, NVML library,
nvidia-smi or firmware says so with its fix; the CDI hook as each of its flags sets it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.nodes import inventory_of

from dradriver.driver.checks.driver_files import (
    ROOT_FIX,
    driver_root_checks,
    hook_check,
    libcuda_without_nvml,
)
from dradriver.gpu.backend import simulated_driver_root

from .conftest import host

VERSION = inventory_of("dgx-a100-80gb").driver_version


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    """A driver root with this version's libraries, binaries and firmware (the simulator's stub)."""
    return simulated_driver_root(tmp_path / "root", VERSION)


def test_a_complete_driver_root_passes_every_check(tmp_path: Path, stub: Path) -> None:
    root, checks = driver_root_checks(host(tmp_path, driver_root=str(stub)), VERSION)
    assert root is not None
    assert {check.name: check.status for check in checks} == {
        "libcuda": "OK",
        "CUDA libraries": "OK",
        "NVML libraries": "OK",
        "video libraries": "OK",
        "graphics libraries": "OK",
        "binaries": "OK",
        "GSP firmware": "OK",
    }


def test_a_root_missing_nvml_nvidia_smi_and_firmware_says_what_is_missing(tmp_path: Path, stub: Path) -> None:
    for pattern in ("libnvidia-ml.*", "nvidia-smi", "gsp*.bin"):
        for path in stub.rglob(pattern):
            path.unlink()
    _, checks = driver_root_checks(host(tmp_path, driver_root=str(stub)), VERSION)
    found = {check.name: check for check in checks}
    assert found["NVML libraries"].status == "FAIL" and found["NVML libraries"].fix == "reinstall the driver"
    assert found["binaries"].status == "WARN" and found["binaries"].detail == "nvidia-smi not found"
    assert found["GSP firmware"].status == "WARN" and f"nvidia/{VERSION}/gsp" in found["GSP firmware"].detail


def test_a_root_without_this_versions_libcuda_fails(tmp_path: Path, stub: Path) -> None:
    for lib in stub.rglob(f"libcuda.so.{VERSION}"):
        lib.unlink()
    root, [libcuda] = driver_root_checks(host(tmp_path, driver_root=str(stub)), VERSION)
    assert root is None and libcuda.status == "FAIL" and f"libcuda.so.{VERSION}" in libcuda.detail


def test_a_simulated_node_without_a_driver_root_skips_it(tmp_path: Path) -> None:
    root, [check] = driver_root_checks(host(tmp_path), VERSION)
    assert root is None and check.status == "SKIP"


def test_without_nvml_libcuda_is_still_looked_for(tmp_path: Path, stub: Path) -> None:
    found = libcuda_without_nvml(host(tmp_path, driver_root=str(stub)))
    assert found.status == "WARN" and "but NVML did not load" in found.detail
    (tmp_path / "empty").mkdir()
    missing = libcuda_without_nvml(host(tmp_path, driver_root=str(tmp_path / "empty")))
    assert missing.status == "FAIL" and missing.fix == ROOT_FIX


def test_the_hook_is_judged_as_run_finds_it(tmp_path: Path) -> None:
    off = hook_check(host(tmp_path, nvidia_cdi_hook_path="none"))
    assert off.status == "WARN" and off.detail == "hooks turned off"
    given = hook_check(host(tmp_path, nvidia_cdi_hook_path="/opt/hook"))
    assert given.status == "OK" and given.detail == "/opt/hook (as given)"
    source = tmp_path / "image-hook"
    missing = hook_check(host(tmp_path, cdi_hook_source=str(source)))
    assert missing.status == "FAIL" and missing.detail == f"--cdi-hook-source {source} is not a file"
    source.write_text("#!/bin/sh\n")
    copied = hook_check(host(tmp_path, cdi_hook_source=str(source)))
    assert copied.status == "OK" and str(tmp_path / "plugins/gpu.dradriver.dev/nvidia-cdi-hook") in copied.detail
    (tmp_path / "empty").mkdir()
    none = hook_check(host(tmp_path, driver_root=str(tmp_path / "empty")))
    assert none.status == "WARN" and "--cdi-hook-source" in none.fix
