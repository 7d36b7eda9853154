"""GPU Feature Discovery's labels computed from simulated nodes' inventories, rule by rule (internal/lm of
NVIDIA/k8s-device-plugin)."""

from dataclasses import replace

import pytest
from support.nodes import inventory_of

from dradriver.driver.publish.node_labels import (
    OWNED_LABEL_PREFIXES,
    PCI_CLASS_3D,
    PCI_CLASS_VGA,
    LabelOptions,
    MigStrategy,
    annotation_key,
    arch_family,
    gfd_labels,
    is_owned,
    labelled_product,
    labels_patch,
    sanitise,
    written_keys,
)
from dradriver.gpu.inventory import Inventory

H100 = inventory_of("hgx-h100-80gb")
MIXED = inventory_of("mixed")  # GPU 0: A100 with MIG 3g.20gb, 2g.10gb, 1g.5gb; three A100s without; two L4s
GB200 = inventory_of("gb200-nvl72-tray")


def labels(inventory: Inventory, **options: object) -> dict[str, str]:
    return gfd_labels(inventory, LabelOptions(**options))  # type: ignore[arg-type]


def mig_a100_only(profiles: set[str] | None = None) -> Inventory:
    """The mixed node's MIG-enabled A100 alone, with its MIG devices of ``profiles`` (all when None)."""
    gpu = MIXED.gpus[0]
    devices = tuple(d for d in MIXED.mig_devices if profiles is None or d.profile.name in profiles)
    return replace(MIXED, gpus=(gpu,), mig_devices=devices)


def test_an_h100_node_gets_every_gfd_label():
    bus_ids = {g.info.pci_bus_id: PCI_CLASS_3D for g in H100.gpus}
    got = labels(H100, machine_type="  DGX H100 (rev. 2)\n", pci_classes=bus_ids)
    assert got == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.machine": "DGX-H100-rev.-2",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "65",
        "nvidia.com/cuda.driver.rev": "06",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "65",
        "nvidia.com/cuda.driver-version.revision": "06",
        "nvidia.com/cuda.driver-version.full": "580.65.06",
        "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
    }
    assert all(is_owned(key) for key in got)


def test_a_node_without_gpus_gets_no_labels_at_all():
    assert labels(replace(H100, gpus=(), mig_devices=())) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("  Tesla  V100 (PCIe)/32GB ", "Tesla-V100-PCIe32GB"),
        ("a_b.c+d", "a_b.cd"),
        ("", ""),
    ],
)
def test_sanitise_keeps_letters_digits_dash_underscore_dot_and_joins_words_with_dashes(text, expected):
    assert sanitise(text) == expected


@pytest.mark.parametrize(
    ("major", "minor", "family"),
    [
        (1, 3, "tesla"),
        (2, 0, "fermi"),
        (3, 5, "kepler"),
        (4, 0, "undefined"),
        (5, 2, "maxwell"),
        (6, 1, "pascal"),
        (7, 0, "volta"),
        (7, 4, "volta"),
        (7, 5, "turing"),
        (8, 0, "ampere"),
        (8, 6, "ampere"),
        (8, 9, "ada-lovelace"),
        (9, 0, "hopper"),
        (10, 0, "blackwell"),
        (11, 0, "undefined"),
        (12, 0, "blackwell"),
        (13, 0, "rubin"),
        (14, 0, "undefined"),
    ],
)
def test_family_follows_gfds_table_of_compute_capabilities(major, minor, family):
    assert arch_family(major, minor) == family


def test_family_and_compute_labels_are_left_out_for_compute_capability_zero_and_memory_for_zero_bytes():
    gpu = H100.gpus[0]
    odd = replace(gpu, info=replace(gpu.info, cuda_compute_capability=(0, 0), memory_bytes=0))
    got = labels(replace(H100, gpus=(odd,)))
    assert not {"nvidia.com/gpu.family", "nvidia.com/gpu.compute.major", "nvidia.com/gpu.memory"} & set(got)
    assert got["nvidia.com/gpu.count"] == "1"


def test_with_several_products_one_with_a_gpu_without_mig_is_labelled_then_most_gpus_then_first_name():
    assert labelled_product(MIXED.gpus) == "NVIDIA A100-SXM4-40GB"  # 4 A100s, 2 L4s
    assert labels(MIXED)["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels(MIXED)["nvidia.com/gpu.count"] == "4"  # the MIG-enabled one counts too
    l4s = [g for g in MIXED.gpus if g.info.product_name == "NVIDIA L4"]
    one_each = replace(MIXED, gpus=(l4s[0], MIXED.gpus[1]), mig_devices=())
    assert labels(one_each)["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"  # a tie: the first name
    # As GFD, whose full-GPU labels overwrite the MIG-enabled products': a product with a GPU without MIG wins.
    all_mig = tuple(replace(g, mig_enabled=g.info.mig_capable) for g in MIXED.gpus)
    assert labelled_product(all_mig) == "NVIDIA L4"
    assert labels(replace(MIXED, gpus=all_mig, mig_devices=()))["nvidia.com/gpu.count"] == "2"
    assert labelled_product(all_mig[:4]) == "NVIDIA A100-SXM4-40GB"  # every GPU has MIG on: the most GPUs
    only_l4 = labels(replace(MIXED, gpus=tuple(l4s), mig_devices=()))
    assert only_l4["nvidia.com/gpu.family"] == "ada-lovelace"
    assert only_l4["nvidia.com/mig.capable"] == "false"


def test_replicas_is_zero_only_when_every_gpu_of_the_product_has_mig_enabled():
    assert labels(MIXED)["nvidia.com/gpu.replicas"] == "1"
    assert labels(mig_a100_only())["nvidia.com/gpu.replicas"] == "0"
    assert labels(mig_a100_only())["nvidia.com/gpu.count"] == "1"


def test_driver_versions_of_two_parts_have_an_empty_revision_and_others_no_driver_labels():
    two = labels(replace(H100, driver_version="580.65"))
    assert two["nvidia.com/cuda.driver-version.revision"] == ""
    assert two["nvidia.com/cuda.driver.rev"] == ""
    assert two["nvidia.com/cuda.driver-version.full"] == "580.65"
    odd = labels(replace(H100, driver_version="580"))
    assert not any(key.startswith("nvidia.com/cuda.driver") for key in odd)
    assert odd["nvidia.com/cuda.runtime-version.full"] == "13.0"


def test_cuda_runtime_labels_come_from_the_cuda_driver_api_version():
    got = labels(MIXED)  # NVML 12040
    assert (got["nvidia.com/cuda.runtime-version.major"], got["nvidia.com/cuda.runtime-version.minor"]) == ("12", "4")
    assert got["nvidia.com/cuda.runtime-version.full"] == "12.4"


def test_mig_strategy_none_writes_no_mig_labels():
    assert not any(key.startswith(("nvidia.com/mig-", "nvidia.com/mig.strategy")) for key in labels(MIXED))


def test_mig_strategy_mixed_labels_each_existing_profile():
    got = labels(MIXED, mig_strategy=MigStrategy.MIXED)
    assert got["nvidia.com/mig.strategy"] == "mixed"
    counts = {
        key.removeprefix("nvidia.com/mig-").removesuffix(".count"): v
        for key, v in got.items()
        if key.startswith("nvidia.com/mig-") and key.endswith(".count")
    }
    assert counts == {"3g.20gb": "1", "2g.10gb": "1", "1g.5gb": "1"}
    prefix = "nvidia.com/mig-3g.20gb"
    assert {k.removeprefix(prefix + "."): v for k, v in got.items() if k.startswith(prefix + ".")} == {
        "count": "1",
        "product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "replicas": "1",
        "sharing-strategy": "none",
        "memory": "19968",
        "multiprocessors": "42",
        "slices.gi": "3",
        "slices.ci": "3",
        "engines.copy": "3",
        "engines.decoder": "2",
        "engines.encoder": "0",
        "engines.jpeg": "0",
        "engines.ofa": "0",
    }
    # Whole GPUs keep their labels beside the MIG ones.
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_mixed_names_a_profile_with_plus_by_a_dot_as_gfd_does():
    device = MIXED.mig_devices[0]
    me = replace(device, profile=replace(device.profile, name="1g.10gb+me"))
    got = labels(replace(MIXED, mig_devices=(me,)), mig_strategy=MigStrategy.MIXED)
    assert got["nvidia.com/mig-1g.10gb.me.count"] == "1"
    assert got["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb.me"


def test_mixed_counts_devices_of_one_profile_across_gpus():
    second = replace(MIXED.mig_devices[0], name="z-second")
    got = labels(replace(MIXED, mig_devices=(MIXED.mig_devices[0], second)), mig_strategy=MigStrategy.MIXED)
    profile = MIXED.mig_devices[0].profile.name
    assert got[f"nvidia.com/mig-{profile}.count"] == "2"


def test_mig_strategy_single_with_one_profile_labels_mig_devices_as_nvidia_com_gpu():
    got = labels(mig_a100_only({"3g.20gb"}), mig_strategy=MigStrategy.SINGLE)
    assert got["nvidia.com/mig.strategy"] == "single"
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert got["nvidia.com/gpu.count"] == "1"
    assert got["nvidia.com/gpu.memory"] == "19968"
    assert got["nvidia.com/gpu.replicas"] == "1"
    assert got["nvidia.com/gpu.slices.gi"] == "3"
    assert got["nvidia.com/gpu.engines.copy"] == "3"
    assert got["nvidia.com/gpu.family"] == "ampere"  # the whole GPU's architecture labels stay
    assert not any(key.startswith("nvidia.com/mig-") for key in got)


INVALID = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
    "nvidia.com/gpu.count": "0",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/gpu.sharing-strategy": "",
    "nvidia.com/gpu.memory": "0",
}


@pytest.mark.parametrize(
    "inventory",
    [
        pytest.param(mig_a100_only(), id="more-than-one-profile"),
        pytest.param(MIXED, id="mig-enabled-and-disabled-gpus"),
        pytest.param(mig_a100_only(set()), id="mig-enabled-gpu-without-mig-devices"),
    ],
)
def test_mig_strategy_single_writes_the_invalid_labels_where_it_cannot_describe_the_node(inventory):
    got = labels(inventory, mig_strategy=MigStrategy.SINGLE)
    assert {key: got[key] for key in INVALID} == INVALID
    assert got["nvidia.com/mig.strategy"] == "single"


def test_mig_strategy_single_without_mig_enabled_gpus_adds_only_the_strategy():
    plain = labels(H100)
    single = labels(H100, mig_strategy=MigStrategy.SINGLE)
    assert single == {**plain, "nvidia.com/mig.strategy": "single"}


def test_mps_capable_only_with_mps_sharing_and_no_mig_enabled_gpu():
    assert labels(H100)["nvidia.com/mps.capable"] == "false"
    assert labels(H100, mps_sharing=True)["nvidia.com/mps.capable"] == "true"
    assert labels(MIXED, mps_sharing=True)["nvidia.com/mps.capable"] == "false"


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ({0: PCI_CLASS_3D, 1: PCI_CLASS_3D}, "compute"),
        ({0: PCI_CLASS_VGA, 1: PCI_CLASS_VGA}, "graphics"),
        ({0: PCI_CLASS_VGA, 1: PCI_CLASS_3D}, "unknown"),
        ({0: PCI_CLASS_3D}, "unknown"),  # one GPU's class unread
        ({0: 0x068000, 1: 0x068000}, "unknown"),
        (None, "unknown"),
    ],
)
def test_gpu_mode_from_every_gpus_pci_class(classes, mode):
    two = replace(H100, gpus=H100.gpus[:2])
    by_bus = None if classes is None else {two.gpus[i].info.pci_bus_id: c for i, c in classes.items()}
    assert labels(two, pci_classes=by_bus)["nvidia.com/gpu.mode"] == mode


def test_machine_is_unknown_when_unreadable_and_left_out_when_kubernetes_would_refuse_it():
    assert labels(H100)["nvidia.com/gpu.machine"] == "unknown"
    assert "nvidia.com/gpu.machine" not in labels(H100, machine_type="x" * 64)
    assert "nvidia.com/gpu.machine" not in labels(H100, machine_type="ends with a dot.")


def test_clique_label_when_the_fabric_gpus_share_one_clique():
    assert labels(GB200)["nvidia.com/gpu.clique"] == "9f410827-489f-46fd-8203-51266ca08eb7.32766"
    assert "nvidia.com/gpu.clique" not in labels(H100)  # a single-node NVSwitch fabric has no clique
    other = replace(GB200.gpus[1], nvlink_domain="clique-9f410827-489f-46fd-8203-51266ca08eb7.7")
    assert "nvidia.com/gpu.clique" not in labels(replace(GB200, gpus=(GB200.gpus[0], other)))
    alone = replace(GB200.gpus[1], nvlink_domain="single-0009-01-00-0")  # registration not complete
    assert labels(replace(GB200, gpus=(GB200.gpus[0], alone)))["nvidia.com/gpu.clique"].endswith(".32766")


def test_owned_prefixes_and_the_annotation_key():
    assert OWNED_LABEL_PREFIXES == (
        "nvidia.com/gpu.",
        "nvidia.com/cuda.",
        "nvidia.com/mig.",
        "nvidia.com/mig-",
        "nvidia.com/mps.",
    )
    assert is_owned("nvidia.com/mig-1g.10gb.count")
    assert not is_owned("nvidia.com/gpu")
    assert not is_owned("nvidia.com/gfd.timestamp")
    assert not is_owned("team")
    assert annotation_key("gpu.dradriver.dev") == "gpu.dradriver.dev/node-labels"


def test_patch_sets_wanted_removes_previous_and_lists_what_it_wrote():
    patch = labels_patch(
        {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "X", "team": "a"},
        previous=["nvidia.com/gpu.count", "nvidia.com/mig.strategy", "kubernetes.io/hostname"],
        driver_name="gpu.dradriver.dev",
    )
    assert patch == {
        "metadata": {
            "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "X", "nvidia.com/mig.strategy": None},
            "annotations": {"gpu.dradriver.dev/node-labels": "nvidia.com/gpu.count,nvidia.com/gpu.product"},
        }
    }


def test_patch_of_nothing_wanted_removes_the_labels_and_the_annotation():
    patch = labels_patch({}, previous=["nvidia.com/gpu.count"], driver_name="d.example.com")
    assert patch == {
        "metadata": {"labels": {"nvidia.com/gpu.count": None}, "annotations": {"d.example.com/node-labels": None}}
    }


def test_written_keys_reads_the_annotation_and_trusts_it_only_for_owned_keys():
    node = {"metadata": {"annotations": {"gpu.dradriver.dev/node-labels": "nvidia.com/gpu.count, team,nvidia.com/x"}}}
    assert written_keys(node, "gpu.dradriver.dev") == ["nvidia.com/gpu.count"]
    assert written_keys({"metadata": {}}, "gpu.dradriver.dev") == []
