"""Discovery on simulated nodes: names, identities, NVLink domains and what each MIG mode offers."""

import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.nodes import inventory_of

from dradriver.gpu.errors import GpuError, NvmlReleased
from dradriver.gpu.inventory import GpuDevice, MigMode, MigPartition, discover, gpu_name, partition_name
from dradriver.gpu.models import FabricInfo, FabricState, MigProfile, Placement
from dradriver.sim.fakelib import simulated_gpulib
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

DGX_A100_BUSES = [
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
]
CLUSTER = "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
CLIQUE_NODE = f"""\
name: gh200-clique
nvswitch: true
fabric: {{clusterUuid: {CLUSTER}, cliqueId: 7}}
gpus:
  - {{product: NVIDIA H100 80GB HBM3, pciBusId: "0000:1b:00.0"}}
  - {{product: NVIDIA H100 80GB HBM3, pciBusId: "0000:43:00.0"}}
  - {{product: NVIDIA H100 80GB HBM3, pciBusId: "0000:52:00.0"}}
"""


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


def test_pre_hopper_gpus_without_fabric_info_still_share_their_nvswitch_domain():
    assert {g.nvlink_domain for g in inventory_of("dgx-a100-80gb").gpus} == {"nvswitch-0000-07-00-0"}


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (FabricState.IN_PROGRESS, 0),
        (FabricState.NOT_STARTED, 0),
        (FabricState.COMPLETED, 999),
    ],
)
def test_a_gpu_whose_fabric_registration_is_not_complete_is_left_out_of_the_switch_domain(
    state: FabricState, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    gpulib, node = simulated_gpulib("hgx-h100-80gb")
    node.set_fabric_state(0, state, status)
    with caplog.at_level(logging.WARNING, logger="dradriver.gpu.inventory"):
        domains = [g.nvlink_domain for g in discover(gpulib).gpus]
    assert domains[0] == "single-0000-1b-00-0"
    # The switch domain is named after its lowest PCI address among the GPUs that are in it.
    assert set(domains[1:]) == {"nvswitch-0000-43-00-0"}
    assert f"gpu=0000:1b:00.0 state={state.name} status={status}" in caplog.text


def test_a_gpu_joins_the_switch_domain_once_its_registration_completes():
    gpulib, node = simulated_gpulib("hgx-h100-80gb")
    node.set_fabric_state(7, FabricState.IN_PROGRESS)
    assert discover(gpulib).gpus[7].nvlink_domain == "single-0000-df-00-0"
    node.set_fabric_state(7, FabricState.COMPLETED)
    assert discover(gpulib).gpus[7].nvlink_domain == "nvswitch-0000-1b-00-0"  # a rescan with the same NVML


def test_gpus_of_a_multi_node_clique_share_one_domain_across_nodes(profile_file: Callable[[str], str]):
    path = profile_file(CLIQUE_NODE)
    node_a = inventory_of(path, node="node-a")
    node_b = inventory_of(path, node="node-b")
    expected = f"clique-{CLUSTER}.7"
    assert len(expected) <= 64  # the API server's limit for a string attribute
    assert {g.nvlink_domain for g in node_a.gpus} == {g.nvlink_domain for g in node_b.gpus} == {expected}


def test_a_clique_gpu_still_registering_gets_its_own_domain(profile_file: Callable[[str], str]):
    gpulib, node = simulated_gpulib(profile_file(CLIQUE_NODE))
    node.set_fabric_state(1, FabricState.IN_PROGRESS)
    domains = [g.nvlink_domain for g in discover(gpulib).gpus]
    assert domains == [f"clique-{CLUSTER}.7", "single-0000-43-00-0", f"clique-{CLUSTER}.7"]


class _FabricFails:
    """The simulated NVML, except that fabric info fails (as on a driver without the call)."""

    def __init__(self, profile: str) -> None:
        self.inner, _ = simulated_gpulib(profile)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fabric_info(self, gpu_uuid: str, *, fresh: bool = False) -> FabricInfo | None:
        raise GpuError("Function Not Found", device=gpu_uuid, call="nvmlDeviceGetGpuFabricInfoV")


def test_when_fabric_info_cannot_be_read_the_nvlinks_alone_decide():
    assert {g.nvlink_domain for g in discover(_FabricFails("hgx-h100-80gb")).gpus} == {"nvswitch-0000-1b-00-0"}


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
        "1g.10gb": 19,
        "1g.10gb+me": 20,
        "1g.20gb": 15,
        "2g.20gb": 14,
        "3g.40gb": 9,
        "4g.40gb": 5,
        "7g.80gb": 0,
    }
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


@pytest.mark.parametrize(
    ("mode", "gpus", "migs"),
    [
        (MigMode.NONE, 5, 0),  # the MIG-enabled A100 is left to its MIG devices
        (MigMode.STATIC, 5, 3),
        (MigMode.DYNAMIC, 6, 4 * 25),  # every A100-40GB offers 25 profile x placement partitions
    ],
)
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
        "  - {product: Tesla T4, pciBusId: '0000:17:00.0'}\n"
    )
    inventory = inventory_of(str(profile))
    assert [g.name for g in inventory.gpus] == ["gpu-0000-17-00-0", "gpu-0000-b1-00-0"]
    assert [g.info.index for g in inventory.gpus] == [0, 1]


def _profile(name: str, profile_id: int) -> MigProfile:
    return MigProfile(
        id=profile_id,
        name=name,
        slice_count=1,
        memory_slices=1,
        max_instances=1,
        memory_mib=24064,
        multiprocessors=16,
        copy_engines=1,
        decoders=1,
        encoders=0,
        jpeg_engines=1,
        ofa_engines=1,
        placements=(Placement(0, 1),),
    )


def test_media_extension_and_no_media_profiles_get_different_names():
    # Blackwell offers both 1g.24gb+me (NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1) and 1g.24gb-me (…_1_SLICE_NO_ME).
    with_me = partition_name("gpu-0000-07-00-0", _profile("1g.24gb+me", 20), Placement(3, 1))
    without_me = partition_name("gpu-0000-07-00-0", _profile("1g.24gb-me", 24), Placement(3, 1))
    assert with_me == "gpu-0000-07-00-0-mig-1g24gbme-3"  # docs/slices.md: without dots or +
    assert without_me == "gpu-0000-07-00-0-mig-1g24gb-me-3"


def test_a_lost_gpu_is_skipped_and_listed_and_the_others_are_offered():
    gpulib, node = simulated_gpulib("dgx-a100-40gb")
    before = discover(gpulib)
    node.lose_gpu(5)
    after = discover(gpulib)
    assert [g.name for g in after.gpus] == [g.name for g in before.gpus if g.info.index != 5]
    [lost] = after.lost_gpus
    assert (lost.index, lost.name, lost.uuid) == (5, before.gpus[5].name, before.gpus[5].uuid)
    assert "fell off the bus" in lost.reason
    node.reset_gpu(5)
    assert discover(gpulib).gpus == before.gpus
    gpulib.close()


@pytest.mark.parametrize("call", ["probe", "mig_mode"])
def test_nvml_let_go_for_an_unbind_elsewhere_fails_the_discovery_instead_of_losing_every_gpu(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A rescan that runs while NVML is let go for a stuck unbind (NvmlReleased) must not list the node's healthy
    GPUs as lost (they would be tainted gpu-lost): the discovery fails, and the caller keeps the last inventory."""
    gpulib, _ = simulated_gpulib("dgx-a100-40gb")
    discover(gpulib)

    def let_go(*_args: Any, **_kwargs: Any) -> Any:
        raise NvmlReleased("NVML is let go while a GPU's unbind from the nvidia driver is still in the kernel")

    monkeypatch.setattr(gpulib, call, let_go)
    with pytest.raises(NvmlReleased):
        discover(gpulib)
    gpulib.close()


def test_a_gpu_lost_before_it_was_ever_read_is_listed_by_index(tmp_path):
    state = tmp_path / "state.json"
    SimulatedNode(load_node_profile("dgx-a100-40gb"), state_path=state).lose_gpu(0)
    gpulib, _ = simulated_gpulib("dgx-a100-40gb", state_path=state)
    inventory = discover(gpulib)
    assert len(inventory.gpus) == 7
    assert [(g.index, g.name, g.uuid) for g in inventory.lost_gpus] == [(0, None, None)]
    gpulib.close()
