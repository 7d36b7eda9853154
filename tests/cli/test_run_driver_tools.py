"""The driver's own `nvidia-smi` (GPU reset, time-slice: NVML has no public call for either) is the driver root's,
run with the driver root's libraries: in the driver's pod it is at /driver-root/usr/bin/nvidia-smi or below
/usr/local/nvidia, on no PATH, and its libnvidia-ml is in no loader cache of the image. Where the root has none,
the one on PATH is tried, as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from dradriver.cli.run_assembly import nvidia_smi_of, use_driver_tools
from dradriver.gpu.errors import GpuError
from dradriver.gpu.nvml import NvidiaSmi, NvmlGpuLib
from dradriver.nvidia_install.driver_root import DriverFile, DriverRoot
from dradriver.sim.fakelib import SimMigCapabilities, SimPciTopology, fake_pynvml
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

# A root laid out as the lent H100 host's (driver 580 in /usr/local/nvidia), seen by the container at its path.
SMI = PurePosixPath("usr/local/nvidia/bin/nvidia-smi")
LIBRARIES = PurePosixPath("usr/local/nvidia/lib64")
RECORDING_SMI = """#!/bin/sh
printf '%s\\n' "$*" >>"$(dirname "$0")/calls"
printf '%s\\n' "$LD_LIBRARY_PATH" >>"$(dirname "$0")/library-paths"
"""


def driver_root(container_root: Path, *, binaries: tuple[PurePosixPath, ...] = (SMI,)) -> DriverRoot:
    libcuda = DriverFile(LIBRARIES / "libcuda.so.580.95.05", ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",))
    return DriverRoot(
        host_root=PurePosixPath("/"),
        container_root=container_root,
        version="580.95.05",
        machine="x86_64",
        libcuda=libcuda,
        libraries=(libcuda,),
        symlinks=(),
        firmware=(),
        binaries=tuple(DriverFile(b, (f"/usr/bin/{b.name}",)) for b in binaries),
        sockets=(),
        config_files=(),
        cdi_hook=None,
        source_dirs=(LIBRARIES,),
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    smi = tmp_path / SMI
    smi.parent.mkdir(parents=True)
    smi.write_text(RECORDING_SMI)
    smi.chmod(0o755)
    return tmp_path


@pytest.fixture
def node() -> SimulatedNode:
    return SimulatedNode(load_node_profile("hgx-h100-80gb"))


@pytest.fixture
def lib(node: SimulatedNode) -> Iterator[NvmlGpuLib]:
    """NVML's backend as `run` opens it on a real node (no reset or time-slice stand-in), over a simulated node."""
    gpulib = NvmlGpuLib(
        nvml=fake_pynvml(node), pci_topology=SimPciTopology(node), mig_capabilities=SimMigCapabilities()
    )
    yield gpulib
    gpulib.close()


def calls(root: Path) -> list[str]:
    return (root / SMI.parent / "calls").read_text().splitlines()


def test_the_time_slice_is_set_with_the_driver_root_s_nvidia_smi_and_its_libraries(root: Path, lib: NvmlGpuLib) -> None:
    gpu = lib.gpus()[0].uuid
    use_driver_tools(lib, driver_root(root), simulated=False)

    lib.set_timeslice(gpu, 2)

    assert calls(root) == [f"compute-policy -i {gpu} --set-timeslice 2"]
    assert (root / SMI.parent / "library-paths").read_text().splitlines() == [str(root / LIBRARIES)]


def test_a_gpu_reset_runs_the_same_nvidia_smi(root: Path, lib: NvmlGpuLib) -> None:
    gpu = lib.gpus()[0].uuid
    use_driver_tools(lib, driver_root(root), simulated=False)

    lib.reset_gpu(gpu)

    assert calls(root) == [f"--gpu-reset -i {gpu}"]


def test_a_root_without_nvidia_smi_leaves_the_one_on_path(tmp_path: Path) -> None:
    assert nvidia_smi_of(driver_root(tmp_path, binaries=())) == NvidiaSmi(("nvidia-smi",))


def test_a_missing_nvidia_smi_is_an_error_naming_the_path_tried(tmp_path: Path, lib: NvmlGpuLib) -> None:
    gpu = lib.gpus()[0].uuid
    use_driver_tools(lib, driver_root(tmp_path), simulated=False)  # the root names a file that is not there

    with pytest.raises(GpuError, match=rf"cannot run {tmp_path / SMI} to set the time-slice"):
        lib.set_timeslice(gpu, 1)
