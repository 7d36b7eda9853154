"""Discovery on simulated nodes: names, identities, NVLink domains and what each MIG mode offers."""


import pytest
from support.nodes import inventory_of

from dradriver.gpu.inventory import GpuDevice, MigMode, MigPartition, gpu_name

DGX_A100_BUSES = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                  "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"]




def test_dgx_a100_80gb_lists_eight_gpus_named_after_their_pci_address():
    inventory = inventory_of("dgx-a100-80gb")
    assert [g.info.pci_bus_id for g in inventory.gpus] == DGX_A100_BUSES
    assert [g.name for g in inventory.gpus] == [gpu_name(b) for b in DGX_A100_BUSES]
    assert inventory.gpus[0].name == "gpu-0000-07-00-0"
    for gpu in inventory.gpus:
        assert gpu.info.product_name == "NVIDIA A100-SXM4-80GB"
        assert gpu.info.memory_bytes == 80 * 2**30
        assert gpu.info.uuid.startswith("GPU-")
    assert [g.info.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inventory.driver_version == "580.65.06"
    assert inventory.cuda_driver_version == "13.0.0"


def test_gpus_on_one_nvswitch_fabric_share_one_nvlink_domain():
    inventory = inventory_of("hgx-h100-80gb")
    assert {g.nvlink_domain for g in inventory.gpus} == {"nvswitch-0000-1b-00-0"}


def test_bridged_pairs_form_one_domain_each_and_lone_gpus_their_own():
    pairs = inventory_of("h100-nvl-pairs")
    domains = [g.nvlink_domain for g in pairs.gpus]
    assert domains[0] == domains[1] == "bridge-0000-17-00-0"
    assert domains[2] == domains[3] == "bridge-0000-b1-00-0"
    mixed = inventory_of("mixed")
    l4s = [g for g in mixed.gpus if g.info.product_name == "NVIDIA L4"]
    assert [g.nvlink_domain for g in l4s] == ["single-0000-87-00-0", "single-0000-90-00-0"]


def test_every_mig_profile_and_placement_is_discovered_with_real_profile_ids():
    gpu = inventory_of("dgx-a100-80gb").gpus[0]
    by_name = {p.name: p for p in gpu.mig_profiles}
    assert {name: p.id for name, p in by_name.items()} == {
        "1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0}
    assert [p.start for p in by_name["1g.10gb"].placements] == [0, 1, 2, 3, 4, 5, 6]
    assert [(p.start, p.size) for p in by_name["3g.40gb"].placements] == [(0, 4), (4, 4)]
    assert [(p.start, p.size) for p in by_name["7g.80gb"].placements] == [(0, 8)]


def test_gpus_without_mig_have_no_profiles():
    l4 = next(g for g in inventory_of("mixed").gpus if g.info.product_name == "NVIDIA L4")
    assert l4.mig_profiles == ()
    assert not l4.info.mig_capable


def test_existing_mig_devices_are_found_and_named_by_profile_and_placement():
    inventory = inventory_of("mixed")
    names = sorted(d.name for d in inventory.mig_devices)
    assert names == ["gpu-0000-07-00-0-mig-1g5gb-6", "gpu-0000-07-00-0-mig-2g10gb-4", "gpu-0000-07-00-0-mig-3g20gb-0"]
    assert all(d.uuid and d.uuid.startswith("MIG-") for d in inventory.mig_devices)


@pytest.mark.parametrize(("mode", "gpus", "migs"), [
    (MigMode.NONE, 5, 0),  # the MIG-enabled A100 is left to its MIG devices
    (MigMode.STATIC, 5, 3),
    (MigMode.DYNAMIC, 6, 4 * 25),  # every A100-40GB offers 25 profile x placement partitions
])
def test_each_mig_mode_offers_its_devices(mode, gpus, migs):
    offered = inventory_of("mixed").devices(mode)
    assert sum(isinstance(d, GpuDevice) for d in offered) == gpus
    assert sum(isinstance(d, MigPartition) for d in offered) == migs


def test_dynamic_partitions_reuse_existing_mig_devices_in_place():
    inventory = inventory_of("mixed")
    partitions = inventory.partitions(inventory.gpus[0])
    existing = [p for p in partitions if p.existing is not None]
    assert sorted(p.name for p in existing) == sorted(d.name for d in inventory.mig_devices)


def test_names_and_uuids_are_stable_across_restarts_and_differ_between_nodes(tmp_path):
    first = inventory_of("dgx-a100-40gb", tmp_path / "state.json")
    again = inventory_of("dgx-a100-40gb", tmp_path / "state.json")
    assert [(g.name, g.uuid) for g in first.gpus] == [(g.name, g.uuid) for g in again.gpus]
    other_node = inventory_of("dgx-a100-40gb", node="node-b")
    assert [g.name for g in other_node.gpus] == [g.name for g in first.gpus]
    assert not {g.uuid for g in other_node.gpus} & {g.uuid for g in first.gpus}


def test_names_follow_the_pci_address_not_the_order_in_the_profile(tmp_path):
    profile = tmp_path / "reversed.yaml"
    profile.write_text(
        "name: reversed\n"
        "gpus:\n"
        "  - {product: Tesla T4, pciBusId: '0000:b1:00.0'}\n"
        "  - {product: Tesla T4, pciBusId: '0000:17:00.0'}\n")
    inventory = inventory_of(str(profile))
    assert [g.name for g in inventory.gpus] == ["gpu-0000-17-00-0", "gpu-0000-b1-00-0"]
    assert [g.info.index for g in inventory.gpus] == [0, 1]
