"""The driver's own tools run from its pod with the driver root's libraries and never the host's C library.

`nvidia-smi` (GPU reset, time-slice: NVML has no public call for either) is the driver root's, with the root's
libnvidia-ml preloaded (the image's loader knows none; /usr/local/nvidia/bin is on no PATH). The MPS daemon's
LD_LIBRARY_PATH is a directory of links to the driver's libraries alone: on a Debian-like root the libraries'
own directory holds that system's libc.so.6 too, which this image's processes must never load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from dradriver.cli.flags.sharing import SharingOptions
from dradriver.cli.run_assembly import mps_commands, nvidia_smi_of, use_driver_tools
from dradriver.gpu.errors import GpuError
from dradriver.gpu.nvml import NvidiaSmi, NvmlGpuLib
from dradriver.nvidia_install.driver_root import DriverFile, DriverRoot, discover_driver_root
from dradriver.sim.driver_root import write_stub_driver_root
from dradriver.sim.fakelib import SimMigCapabilities, SimPciTopology, fake_pynvml
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

# A root laid out as the lent H100 host's (driver 580 in /usr/local/nvidia), seen by the container at its path.
SMI = PurePosixPath("usr/local/nvidia/bin/nvidia-smi")
LIBRARIES = PurePosixPath("usr/local/nvidia/lib64")
NVML = "libnvidia-ml.so.580.95.05"
RECORDING_SMI = """#!/bin/sh
printf '%s\\n' "$*" >>"$(dirname "$0")/calls"
printf '%s\\n' "$LD_PRELOAD" >>"$(dirname "$0")/preloads"
"""


def driver_root(container_root: Path, *, binaries: tuple[PurePosixPath, ...] = (SMI,)) -> DriverRoot:
    libcuda = DriverFile(LIBRARIES / "libcuda.so.580.95.05", ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",))
    nvml = DriverFile(LIBRARIES / NVML, (f"/usr/lib/x86_64-linux-gnu/{NVML}",))
    return DriverRoot(
        host_root=PurePosixPath("/"),
        container_root=container_root,
        version="580.95.05",
        machine="x86_64",
        libcuda=libcuda,
        libraries=(libcuda, nvml),
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


def test_the_time_slice_is_set_with_the_driver_root_s_nvidia_smi_and_its_nvml_preloaded(
    root: Path, lib: NvmlGpuLib
) -> None:
    gpu = lib.gpus()[0].uuid
    use_driver_tools(lib, driver_root(root), simulated=False)

    lib.set_timeslice(gpu, 2)

    assert calls(root) == [f"compute-policy -i {gpu} --set-timeslice 2"]
    assert (root / SMI.parent / "preloads").read_text().splitlines() == [str(root / LIBRARIES / NVML)]


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


def test_the_mps_daemon_s_libraries_are_the_driver_s_alone_where_they_sit_beside_the_host_s_libc(
    tmp_path: Path,
) -> None:
    # A Debian or Ubuntu host's root, as `--driver-root /` mounts it: libcuda in the multiarch directory, beside
    # the host's own C library.
    mounted = write_stub_driver_root(tmp_path / "driver-root", "580.65.06", machine="x86_64")
    multiarch = mounted / "usr/lib/x86_64-linux-gnu"
    (multiarch / "libc.so.6").write_text("the host's glibc\n")
    root = discover_driver_root(host_root="/", container_root=mounted, version="580.65.06", machine="x86_64")
    state = tmp_path / "state"

    commands = mps_commands(SharingOptions(), root, simulated=False, state_dir=state)

    links = Path(commands["env"]["LD_LIBRARY_PATH"])
    assert links.parent == state / "driver-libraries" and not (links / "libc.so.6").exists()
    assert (links / "libcuda.so.1").resolve() == multiarch / "libcuda.so.580.65.06"
    assert (links / "libnvidia-ml.so.1").resolve() == multiarch / "libnvidia-ml.so.580.65.06"
    assert all(link.resolve().parent == multiarch for link in links.iterdir())
    # Asked again (a restart, the next claim), the same directory is kept as it is.
    inode = links.stat().st_ino
    assert mps_commands(SharingOptions(), root, simulated=False, state_dir=state)["env"] == commands["env"]
    assert links.stat().st_ino == inode


def test_links_that_no_longer_match_the_root_are_rewritten(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = write_stub_driver_root(tmp_path / "first", "580.65.06", machine="x86_64")
    second = write_stub_driver_root(tmp_path / "second", "580.65.06", machine="x86_64")
    for mounted in (first, second):
        root = discover_driver_root(host_root="/", container_root=mounted, version="580.65.06", machine="x86_64")
        links = Path(mps_commands(SharingOptions(), root, simulated=False, state_dir=state)["env"]["LD_LIBRARY_PATH"])
        assert (links / "libcuda.so.1").resolve().is_relative_to(mounted)
    assert [p.name for p in links.parent.iterdir()] == ["580.65.06-container"]  # nothing left aside
