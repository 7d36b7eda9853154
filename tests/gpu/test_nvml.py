"""NvmlGpuLib's own logic: bus-id spelling, profile names, and where sysfs says a GPU sits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dradriver.gpu.models import MIB
from dradriver.gpu.nvml import SysfsPciTopology, mig_profile_name, normalize_pci_bus_id
from dradriver.gpu.products import load_products


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:07:00.0", "0000:07:00.0"),
        ("00000000:BD:00.0", "0000:bd:00.0"),
        ("00000001:0F:00.1", "0001:0f:00.1"),
        ("0000:c4:00.0", "0000:c4:00.0"),
    ],
)
def test_nvml_bus_ids_are_normalised_to_the_sysfs_form(nvml: str, sysfs: str) -> None:
    assert normalize_pci_bus_id(nvml) == sysfs


@pytest.mark.parametrize("product", sorted(name for name, p in load_products().items() if p.mig_capable))
def test_derived_profile_names_match_nvidia_smi_for_every_product(product: str) -> None:
    spec = load_products()[product]
    for profile in spec.mig_profiles:
        assert mig_profile_name(profile.enum, profile.slices, profile.memory_mib, spec.memory_mib * MIB) == profile.name


def test_profile_name_suffixes_follow_the_profile_enum() -> None:
    total = 81920 * MIB
    assert mig_profile_name(0xF, 1, 9728, total) == "1g.10gb+me.all"
    assert mig_profile_name(0xD, 1, 9728, total) == "1g.10gb-me"
    assert mig_profile_name(0xA, 1, 9728, total) == "1g.10gb+gfx"


def _device(root: Path, bdf: str, numa: str | None, link: str) -> None:
    target = root / "devices" / link
    target.mkdir(parents=True)
    if numa is not None:
        (target / "numa_node").write_text(numa + "\n")
    os.symlink(target, root / "bus" / bdf)


def test_sysfs_topology_reads_numa_node_and_pcie_root(tmp_path: Path) -> None:
    (tmp_path / "bus").mkdir()
    _device(tmp_path, "0000:07:00.0", "1", "pci0000:00/0000:00:01.0/0000:07:00.0")
    _device(tmp_path, "0000:3b:00.0", "-1", "pci0000:3a/0000:3a:02.0/0000:3b:00.0")
    _device(tmp_path, "0000:5e:00.0", None, "platform/0000:5e:00.0")
    topology = SysfsPciTopology(tmp_path / "bus")
    assert (topology.numa_node("0000:07:00.0"), topology.pcie_root("0000:07:00.0")) == (1, "pci0000:00")
    assert (topology.numa_node("0000:3b:00.0"), topology.pcie_root("0000:3b:00.0")) == (None, "pci0000:3a")
    assert (topology.numa_node("0000:5e:00.0"), topology.pcie_root("0000:5e:00.0")) == (None, None)
    assert (topology.numa_node("0000:99:00.0"), topology.pcie_root("0000:99:00.0")) == (None, None)
