"""The host checks called directly with typed settings: NVML, device nodes and MIG capabilities, persistence
mode, the NVLink fabric and writable directories, each passing and failing."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.nodes import inventory_of

from dradriver.driver.checks.driver_files import ROOT_FIX
from dradriver.driver.checks.host import (
    device_node_checks,
    fabric_check,
    gpu_checks,
    persistence_check,
    writable_dir,
)
from dradriver.gpu.backend import open_gpu_backend, simulated_driver_root
from dradriver.gpu.models import FabricState
from dradriver.nvidia_install.driver_root import discover_driver_root

from .conftest import host


def test_a_simulated_node_opens_nvml_and_skips_what_it_does_not_have(tmp_path: Path) -> None:
    checks = {check.name: check for check in gpu_checks(host(tmp_path))}
    assert list(checks) == [
        "NVML",
        "driver version",
        "driver root",
        "device nodes",
        "persistence mode",
        "fabric manager",
    ]
    assert checks["NVML"].status == "OK" and checks["NVML"].detail == "simulated node dgx-a100-80gb"
    assert checks["driver version"].detail.endswith("8 GPU(s), 0 MIG device(s)")
    assert checks["driver root"].status == checks["device nodes"].status == "SKIP"


def test_nvml_that_does_not_load_fails_with_the_driver_root_fix_and_still_looks_for_libcuda(tmp_path: Path) -> None:
    missing = str(tmp_path / "libnvidia-ml.so.1")
    (tmp_path / "root").mkdir()
    settings = host(tmp_path, gpu_backend="nvml", nvml_library=missing, driver_root=str(tmp_path / "root"))
    nvml, libcuda = gpu_checks(settings)
    assert nvml.status == "FAIL" and nvml.fix == ROOT_FIX
    assert libcuda.name == "libcuda" and libcuda.status == "FAIL"


def make_nodes(dev: Path, *names: str) -> None:
    dev.mkdir(exist_ok=True)
    for name in names:
        (dev / name).touch()


def test_device_nodes_and_mig_capabilities_present_pass(tmp_path: Path) -> None:
    inventory = inventory_of("dgx-a100-80gb")
    make_nodes(tmp_path / "dev", "nvidiactl", "nvidia-uvm", *(f"nvidia{gpu.info.minor}" for gpu in inventory.gpus))
    (tmp_path / "capabilities").mkdir()
    nodes, caps = device_node_checks(host(tmp_path, gpu_backend="nvml"), inventory)
    assert (nodes.status, nodes.detail) == ("OK", "9 present")
    assert caps.name == "MIG capabilities" and caps.status == "OK"


def test_a_missing_gpu_node_fails_a_missing_uvm_warns_and_missing_capabilities_fail(tmp_path: Path) -> None:
    inventory = inventory_of("dgx-a100-80gb")
    minors = [gpu.info.minor for gpu in inventory.gpus]
    make_nodes(tmp_path / "dev", "nvidiactl", *(f"nvidia{minor}" for minor in minors[1:]))
    nodes, caps = device_node_checks(host(tmp_path, gpu_backend="nvml"), inventory)
    assert (
        nodes.status == "FAIL" and nodes.detail == f"missing /dev/nvidia{minors[0]}" and "nvidia-modprobe" in nodes.fix
    )
    assert caps.status == "FAIL" and "mount the host's /proc" in caps.fix
    make_nodes(tmp_path / "dev", f"nvidia{minors[0]}")
    nodes, _ = device_node_checks(host(tmp_path, gpu_backend="nvml"), inventory)
    assert nodes.status == "WARN" and "/dev/nvidia-uvm missing" in nodes.detail


def test_persistence_mode_is_read_from_the_daemons_socket_in_the_driver_root(tmp_path: Path) -> None:
    version = inventory_of("dgx-a100-80gb").driver_version
    stub = simulated_driver_root(tmp_path / "root", version)
    assert persistence_check(None).status == "SKIP"
    without = persistence_check(discover_driver_root(host_root=str(stub), version=version, cdi_hook=None))
    assert without.status == "WARN" and "enable nvidia-persistenced" in without.fix
    (stub / "run/nvidia-persistenced").mkdir(parents=True)
    (stub / "run/nvidia-persistenced/socket").touch()
    running = persistence_check(discover_driver_root(host_root=str(stub), version=version, cdi_hook=None))
    assert running.status == "OK"


def test_a_gpu_not_registered_with_the_nvlink_fabric_fails(tmp_path: Path) -> None:
    gpulib, node = open_gpu_backend("sim", sim_profile="hgx-h100-80gb", sim_state=tmp_path / "state.json")
    assert node is not None
    inventory = inventory_of("hgx-h100-80gb", tmp_path / "state.json")
    try:
        assert fabric_check(gpulib, inventory).detail == "every GPU registered with the NVLink fabric"
        node.set_fabric_state(0, FabricState.IN_PROGRESS)
        check = fabric_check(gpulib, inventory)
        assert check.status == "FAIL" and check.detail.startswith("1 GPU(s) not registered")
    finally:
        gpulib.close()


@pytest.mark.parametrize(("make", "status", "state"), [(True, "OK", "writable"), (False, "FAIL", "missing")])
def test_a_directory_is_writable_or_its_fix_names_the_flag(tmp_path: Path, make: bool, status: str, state: str) -> None:
    path = tmp_path / "cdi"
    if make:
        path.mkdir()
    check = writable_dir("CDI directory", path, "--cdi-dir", "the runtime reads specs there")
    assert check.status == status and check.detail == f"{path} {state}"
    if status == "FAIL":
        assert check.fix == f"create {path} or mount the host's (--cdi-dir): the runtime reads specs there"
