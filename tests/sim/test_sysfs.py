"""The simulated node's sysfs: the tree the real reader walks, and the kernel's refusals on writes."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.sim.sysfs import (
    FIRST_GROUP,
    SimKernel,
    SimPciFunction,
    end_process,
    gpu_functions,
    open_device_node,
    write_tree,
)

GPU = "0000:07:00.0"
AUDIO = "0000:07:00.1"


def make(root: Path, *, holders: list[int] | None = None, vfio_loaded: bool = True) -> HostPci:
    functions = [
        *gpu_functions([(GPU, 0x2330)]),
        SimPciFunction(AUDIO, 0x22A3, pci_class=0x040300, driver="snd_hda_intel", group=FIRST_GROUP),
    ]
    write_tree(root, functions, vfio_loaded=vfio_loaded)
    return HostPci(root, SimKernel(root, lambda _a: list(holders or [])))


def errno_of(call: object) -> int:
    assert callable(call)
    with pytest.raises(OSError, match=r"\w") as caught:
        call()
    return caught.value.errno or 0


def test_the_reader_sees_the_gpu_its_group_and_its_driver(tmp_path: Path) -> None:
    pci = make(tmp_path)
    [gpu] = pci.gpus()  # the audio function is not a GPU
    assert (gpu.address, gpu.vendor, gpu.device_id, gpu.driver, gpu.iommu_group) == (
        GPU,
        "0x10de",
        "0x2330",
        "nvidia",
        FIRST_GROUP,
    )
    assert pci.group_members(FIRST_GROUP) == [GPU, AUDIO]
    assert pci.iommu_enabled() and pci.vfio_module_loaded()
    assert pci.driver_override(GPU) is None


def test_the_group_node_appears_only_when_the_whole_group_is_on_vfio(tmp_path: Path) -> None:
    pci = make(tmp_path)
    for address, driver in ((GPU, "nvidia"), (AUDIO, "snd_hda_intel")):
        pci.set_driver_override(address, "vfio-pci")
        pci.unbind(address, driver)
        pci.bind(address, "vfio-pci")
        assert pci.vfio_group_node(FIRST_GROUP).exists() is (address == AUDIO)
    assert pci.function(GPU).driver == "vfio-pci"
    pci.set_driver_override(GPU, None)
    pci.unbind(GPU, "vfio-pci")
    pci.bind(GPU, "nvidia")
    assert pci.vfio_group_node(FIRST_GROUP).exists()  # the audio function still holds the group
    pci.unbind(AUDIO, "vfio-pci")
    assert not pci.vfio_group_node(FIRST_GROUP).exists()


def test_the_kernel_refuses_as_it_does(tmp_path: Path) -> None:
    pci = make(tmp_path, holders=[4242])
    assert errno_of(lambda: pci.unbind(GPU, "nvidia")) == errno.EBUSY  # a process has it open
    assert errno_of(lambda: pci.unbind(GPU, "vfio-pci")) == errno.ENODEV  # not bound there
    assert errno_of(lambda: pci.bind(GPU, "vfio-pci")) == errno.EBUSY  # bound to nvidia already
    assert errno_of(lambda: pci.bind("0000:99:00.0", "nvidia")) == errno.ENODEV  # no such device
    pci.unbind(AUDIO, "snd_hda_intel")
    assert errno_of(lambda: pci.bind(AUDIO, "vfio-pci")) == errno.ENODEV  # vfio-pci has no ID table: override first
    pci.set_driver_override(AUDIO, "vfio-pci")
    assert errno_of(lambda: pci.bind(AUDIO, "nvidia")) == errno.ENODEV  # the override names another driver
    pci.bind(AUDIO, "vfio-pci")


def test_without_the_vfio_module_binding_to_it_fails(tmp_path: Path) -> None:
    pci = make(tmp_path, vfio_loaded=False)
    assert not pci.vfio_module_loaded()
    assert errno_of(lambda: pci.bind(AUDIO, "vfio-pci")) == errno.ENOENT


def test_the_tree_outlives_a_restart(tmp_path: Path) -> None:
    pci = make(tmp_path)
    pci.set_driver_override(GPU, "vfio-pci")
    pci.unbind(GPU, "nvidia")
    pci.bind(GPU, "vfio-pci")
    again = make(tmp_path)  # written only when absent: the bindings stay as the last driver left them
    assert again.function(GPU).driver == "vfio-pci"
    assert again.driver_override(GPU) == "vfio-pci"


def test_a_process_holding_the_gpus_device_node_makes_its_unbind_busy_until_it_ends(tmp_path: Path) -> None:
    write_tree(tmp_path, gpu_functions([(GPU, 0x2330)]))
    pci = HostPci(tmp_path, SimKernel(tmp_path, minor_of=lambda a: 0 if a == GPU else None))
    open_device_node(tmp_path, pid=900, command="nvidia-smi", minor=0)
    assert [(h.pid, h.command) for h in pci.device_node_holders(0)] == [(900, "nvidia-smi")]
    assert pci.device_node_holders(1) == []
    assert errno_of(lambda: pci.unbind(GPU, "nvidia")) == errno.EBUSY
    end_process(tmp_path, 900)
    assert pci.device_node_holders(0) == []
    pci.unbind(GPU, "nvidia")
    assert pci.function(GPU).driver is None


def test_with_iommufd_a_function_on_vfio_pci_has_its_device_cdev(tmp_path: Path) -> None:
    write_tree(tmp_path, gpu_functions([(GPU, 0x2330), ("0000:08:00.0", 0x2330)]), iommufd=True)
    pci = HostPci(tmp_path, SimKernel(tmp_path))
    assert pci.iommufd_enabled() and pci.vfio_cdev(GPU) is None  # on nvidia: no cdev
    for address in (GPU, "0000:08:00.0"):
        pci.set_driver_override(address, "vfio-pci")
        pci.unbind(address, "nvidia")
        pci.bind(address, "vfio-pci")
    assert (pci.vfio_cdev(GPU), pci.vfio_cdev("0000:08:00.0")) == ("vfio0", "vfio1")
    assert (tmp_path / "dev/vfio/devices/vfio1").exists()
    pci.unbind(GPU, "vfio-pci")
    assert pci.vfio_cdev(GPU) is None and not (tmp_path / "dev/vfio/devices/vfio0").exists()
    assert not HostPci(tmp_path / "elsewhere").iommufd_enabled()
    (tmp_path / "elsewhere/sys/class/misc/iommu").mkdir(parents=True)  # the chart mounts /sys, not all of /dev
    assert HostPci(tmp_path / "elsewhere").iommufd_enabled()
