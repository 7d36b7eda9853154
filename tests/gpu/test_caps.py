"""MIG capability device nodes read from /proc, as the NVIDIA driver lays them out."""

from pathlib import Path

import pytest

from dradriver.gpu.caps import ProcMigCapabilities
from dradriver.gpu.errors import GpuError
from dradriver.gpu.models import DeviceNode

DEVICES = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps\n509 nvidia-uvm\n\nBlock devices:\n  8 sd\n"


def fake_proc(root: Path, *, gpu: int, gi: int, ci: int, gi_minor: int, ci_minor: int) -> Path:
    base = root / f"driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True)
    (base / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\nDeviceFileModify: 0\n")
    (base / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")
    (root / "devices").write_text(DEVICES)
    return root


def test_reads_the_gpu_and_compute_instance_nodes(tmp_path):
    proc = fake_proc(tmp_path, gpu=1, gi=2, ci=0, gi_minor=156, ci_minor=157)
    assert ProcMigCapabilities(proc).device_nodes(1, 2, 0) == (
        DeviceNode("/dev/nvidia-caps/nvidia-cap156", major=508, minor=156, file_mode=0o444),
        DeviceNode("/dev/nvidia-caps/nvidia-cap157", major=508, minor=157, file_mode=0o444),
    )


def test_a_missing_capability_file_names_it(tmp_path):
    proc = fake_proc(tmp_path, gpu=0, gi=1, ci=0, gi_minor=12, ci_minor=13)
    with pytest.raises(GpuError, match=r"gpu0/mig/gi7/access"):
        ProcMigCapabilities(proc).device_nodes(0, 7, 0)


def test_without_nvidia_caps_in_proc_devices_says_what_to_load(tmp_path):
    proc = fake_proc(tmp_path, gpu=0, gi=1, ci=0, gi_minor=12, ci_minor=13)
    (proc / "devices").write_text("Character devices:\n195 nvidia\n\nBlock devices:\n 10 nvidia-caps\n")
    with pytest.raises(GpuError, match="no nvidia-caps character device"):
        ProcMigCapabilities(proc).device_nodes(0, 1, 0)


def test_a_garbled_access_file_is_refused(tmp_path):
    proc = fake_proc(tmp_path, gpu=0, gi=1, ci=0, gi_minor=12, ci_minor=13)
    (proc / "driver/nvidia/capabilities/gpu0/mig/gi1/access").write_text("Minor 12\n")
    with pytest.raises(GpuError, match="DeviceFileMinor"):
        ProcMigCapabilities(proc).device_nodes(0, 1, 0)
