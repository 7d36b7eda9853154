"""The node labeler against the in-memory cluster: it writes GFD's labels and its annotation, writes nothing when
nothing changed, removes exactly what it wrote, leaves Node Feature Discovery's labels alone and shrugs off
refusals."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.nodes import inventory_of

from dradriver.driver.publish.node_labeler import (
    NFD_LABELS_ANNOTATION,
    WRITE_ATTEMPTS,
    HostFacts,
    NodeLabeler,
    NodeLabelerOptions,
    changes_node,
    nfd_managed,
    remove_written,
)
from dradriver.driver.publish.node_labels import MigStrategy
from dradriver.gpu.inventory import LostGpu
from dradriver.plugin.cluster import ConflictError, ForbiddenError
from dradriver.plugin.cluster.memory import MemoryCluster

DRIVER = "gpu.dradriver.dev"
ANNOTATION = f"{DRIVER}/node-labels"
H100 = inventory_of("hgx-h100-80gb")
MIXED = inventory_of("mixed")


class RefusingCluster(MemoryCluster):
    """Refuses Node patches while ``refuse`` is set, counting every patch asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = False
        self.patches = 0

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches += 1
        if self.refuse:
            raise ForbiddenError(f"patch Node {name}: forbidden", status=403)
        return super().patch_node(name, patch)


@pytest.fixture
def cluster() -> RefusingCluster:
    cluster = RefusingCluster()
    cluster.add_node("node-a")
    cluster.patch_node("node-a", {"metadata": {"labels": {"team": "a"}}})
    cluster.patches = 0
    return cluster


def labeler(cluster: MemoryCluster, strategy: MigStrategy = MigStrategy.NONE) -> NodeLabeler:
    options = NodeLabelerOptions(driver_name=DRIVER, node_name="node-a", mig_strategy=strategy)
    return NodeLabeler(cluster, options, host=HostFacts(None))


def labels_of(cluster: MemoryCluster) -> dict[str, str]:
    return dict(cluster.get_node("node-a")["metadata"].get("labels") or {})


def test_update_writes_the_labels_and_lists_them_in_the_annotation(cluster):
    assert labeler(cluster).update(H100)
    labels = labels_of(cluster)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["team"] == "a"
    listed = cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION].split(",")
    assert listed == sorted(key for key in labels if key != "team")


def test_nothing_is_written_when_nothing_changed_even_after_a_restart(cluster):
    first = labeler(cluster)
    first.update(H100)
    version = cluster.get_node("node-a")["metadata"]["resourceVersion"]
    first.update(H100)
    labeler(cluster).update(H100)  # a restarted driver finds its labels there
    assert cluster.patches == 1
    assert cluster.get_node("node-a")["metadata"]["resourceVersion"] == version


def test_a_change_rewrites_values_and_removes_labels_no_longer_wanted(cluster):
    labels = labeler(cluster, MigStrategy.MIXED)
    labels.update(MIXED)
    assert "nvidia.com/mig-3g.20gb.count" in labels_of(cluster)
    labels.update(replace(MIXED, gpus=MIXED.gpus[1:], mig_devices=()))  # the MIG GPU is lost
    after = labels_of(cluster)
    assert not any(key.startswith("nvidia.com/mig-") for key in after)
    assert after["nvidia.com/gpu.count"] == "3"
    assert "nvidia.com/mig-3g.20gb.count" not in cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION]


def test_no_gpus_left_removes_every_label_and_the_annotation(cluster):
    labels = labeler(cluster)
    labels.update(H100)
    labels.update(replace(H100, gpus=(), mig_devices=()))
    assert labels_of(cluster) == {"team": "a"}
    assert ANNOTATION not in (cluster.get_node("node-a")["metadata"].get("annotations") or {})


def test_a_refusal_is_a_warning_and_is_retried_at_the_next_update(cluster, caplog):
    cluster.refuse = True
    labels = labeler(cluster)
    with caplog.at_level(logging.WARNING):
        assert not labels.update(H100)
    assert "cannot write GPU Feature Discovery's labels on Node node-a" in caplog.text
    cluster.refuse = False
    assert labels.update(H100)
    assert "nvidia.com/gpu.present" in labels_of(cluster)


def test_labels_node_feature_discovery_manages_are_left_to_it_with_one_warning(cluster, caplog):
    nfd = "nvidia.com/gpu.product,nvidia.com/gpu.count,cpu-model.vendor_id"
    cluster.patch_node("node-a", {"metadata": {"annotations": {NFD_LABELS_ANNOTATION: nfd}}})
    cluster.patch_node("node-a", {"metadata": {"labels": {"nvidia.com/gpu.product": "Tesla-T4"}}})
    labels = labeler(cluster)
    with caplog.at_level(logging.WARNING):
        labels.update(H100)
        labels.update(replace(H100, gpus=H100.gpus[:4]))
    after = labels_of(cluster)
    assert after["nvidia.com/gpu.product"] == "Tesla-T4"
    assert "nvidia.com/gpu.count" not in after
    assert after["nvidia.com/gpu.memory"] == "81559"
    assert "nvidia.com/gpu.product" not in cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION]
    warnings = [r for r in caplog.records if "Node Feature Discovery" in r.getMessage()]
    assert len(warnings) == 1
    assert "nvidia.com/gpu.count,nvidia.com/gpu.product" in warnings[0].getMessage()


def test_a_key_nfd_takes_over_after_the_driver_wrote_it_is_left_to_nfd(cluster):
    labels = labeler(cluster)
    labels.update(H100)
    # GPU Feature Discovery (through NFD) arrives later and takes the product over.
    nfd = {"annotations": {NFD_LABELS_ANNOTATION: "nvidia.com/gpu.product"}, "labels": {}}
    nfd["labels"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-NFD"}
    cluster.patch_node("node-a", {"metadata": nfd})
    labels.update(replace(H100, gpus=H100.gpus[:4]))  # a GPU change
    assert labels_of(cluster)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-NFD"
    assert labels_of(cluster)["nvidia.com/gpu.count"] == "4"
    assert "nvidia.com/gpu.product" not in cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION]
    assert "nvidia.com/gpu.product" not in remove_written(cluster, "node-a", DRIVER)
    assert labels_of(cluster)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-NFD"


def test_owned_labels_someone_else_put_on_the_node_are_never_adopted_nor_removed(cluster, caplog):
    # An administrator's (or the GPU Operator's) label, with the very value the driver would write.
    cluster.patch_node("node-a", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    labels = labeler(cluster)
    with caplog.at_level(logging.WARNING):
        labels.update(H100)
        labels.update(replace(H100, gpus=H100.gpus[:4]))
    assert "nvidia.com/gpu.present" not in cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION]
    warnings = [r.getMessage() for r in caplog.records if "not written by this driver" in r.getMessage()]
    assert len(warnings) == 1
    assert "labels=nvidia.com/gpu.present" in warnings[0]
    labels.update(replace(H100, gpus=(), mig_devices=()))  # every GPU gone
    assert labels_of(cluster) == {"team": "a", "nvidia.com/gpu.present": "true"}
    labels.update(H100)
    remove_written(cluster, "node-a", DRIVER)  # the uninstall hook
    assert labels_of(cluster) == {"team": "a", "nvidia.com/gpu.present": "true"}


def test_gpu_present_stays_while_the_gpus_have_only_fallen_off_the_bus(cluster):
    labels = labeler(cluster)
    labels.update(H100)
    lost = tuple(
        LostGpu(index=g.info.index, name=g.name, uuid=g.info.uuid, reason="fell off the bus") for g in H100.gpus
    )
    labels.update(replace(H100, gpus=(), mig_devices=(), lost_gpus=lost))
    assert labels_of(cluster) == {"team": "a", "nvidia.com/gpu.present": "true"}
    assert cluster.get_node("node-a")["metadata"]["annotations"][ANNOTATION] == "nvidia.com/gpu.present"
    labels.update(replace(H100, gpus=(), mig_devices=()))  # no GPU at all any more
    assert labels_of(cluster) == {"team": "a"}


class RacingCluster(RefusingCluster):
    """Before each of the first ``races`` Node patches it applies ``other`` first, as another writer of the Node
    (the other pod of a rolling update) would between our read and our write."""

    def __init__(self, other: dict[str, Any], races: int) -> None:
        super().__init__()
        self.other, self.races = other, races

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.races and "resourceVersion" in patch["metadata"]:
            self.races -= 1
            super().patch_node(name, self.other)
        return super().patch_node(name, patch)


def test_a_write_that_lost_a_race_is_recomputed_so_no_key_is_orphaned():
    # The old pod adds mig.strategy (and lists it) between the new pod's read and its write: written blindly, the
    # new pod's annotation would drop the key and leave the label on the Node for ever.
    other = {"labels": {"nvidia.com/mig.strategy": "mixed"}, "annotations": {ANNOTATION: "nvidia.com/mig.strategy"}}
    cluster = RacingCluster({"metadata": other}, races=1)
    cluster.add_node("node-a")
    assert labeler(cluster).update(H100)
    assert "nvidia.com/mig.strategy" not in labels_of(cluster)
    assert labels_of(cluster)["nvidia.com/gpu.count"] == "8"
    assert cluster.patches == 3  # the other writer's, ours refused (409), ours again


def test_losing_every_race_is_a_refusal_retried_at_the_next_update(caplog):
    cluster = RacingCluster({"metadata": {"labels": {"unrelated": "x"}}}, races=WRITE_ATTEMPTS)
    cluster.add_node("node-a")
    labels = labeler(cluster)
    with caplog.at_level(logging.WARNING):
        assert not labels.update(H100)
    assert "has been modified" in caplog.text
    assert labels.update(H100)
    assert labels_of(cluster)["nvidia.com/gpu.count"] == "8"
    with pytest.raises(ConflictError):
        cluster.patch_node("node-a", {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})


def test_remove_takes_off_exactly_what_the_annotation_lists(cluster):
    labeler(cluster).update(H100)
    cluster.patch_node("node-a", {"metadata": {"labels": {"nvidia.com/gpu.deploy.dcgm": "true"}}})
    removed = remove_written(cluster, "node-a", DRIVER)
    assert "nvidia.com/gpu.product" in removed
    assert labels_of(cluster) == {"team": "a", "nvidia.com/gpu.deploy.dcgm": "true"}
    assert ANNOTATION not in cluster.get_node("node-a")["metadata"]["annotations"]


def test_remove_without_the_annotation_writes_nothing(cluster):
    cluster.patch_node("node-a", {"metadata": {"labels": {"nvidia.com/gpu.product": "theirs"}}})
    cluster.patches = 0
    labeler(cluster).remove()
    assert cluster.patches == 0
    assert labels_of(cluster)["nvidia.com/gpu.product"] == "theirs"


def test_remove_refused_is_a_warning_naming_the_command(cluster, caplog):
    labeler(cluster).update(H100)
    cluster.refuse = True
    with caplog.at_level(logging.WARNING):
        labeler(cluster).remove()
    assert "dradriver node-labels remove node-a" in caplog.text


def test_host_facts_read_the_machine_type_and_pci_classes_from_sysfs(tmp_path: Path):
    (tmp_path / "class/dmi/id").mkdir(parents=True)
    (tmp_path / "class/dmi/id/product_name").write_text("DGX H100\n")
    for bus, cls in (("0000:1b:00.0", "0x030200"), ("0000:43:00.0", "0x030200")):
        (tmp_path / "bus/pci/devices" / bus).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / bus / "class").write_text(cls + "\n")
    host = HostFacts(tmp_path)
    assert host.machine_type() == "DGX H100"
    assert host.pci_classes(["0000:1b:00.0", "0000:43:00.0"]) == {"0000:1b:00.0": 0x030200, "0000:43:00.0": 0x030200}
    assert host.pci_classes(["0000:1b:00.0", "0000:99:00.0"]) is None  # one unreadable: all unknown
    assert HostFacts(tmp_path / "absent").machine_type() is None
    assert HostFacts(None).machine_type() is None
    assert HostFacts(None).pci_classes(["0000:1b:00.0"]) is None


def test_nfd_names_without_a_namespace_are_its_own():
    node = {"metadata": {"annotations": {NFD_LABELS_ANNOTATION: "cpu-model.id, nvidia.com/gpu.count,"}}}
    assert nfd_managed(node) == {"feature.node.kubernetes.io/cpu-model.id", "nvidia.com/gpu.count"}


def test_changes_node_compares_values_and_removals():
    node = {"metadata": {"labels": {"a": "1"}, "annotations": {"x": "y"}}}
    assert not changes_node(node, {"metadata": {"labels": {"a": "1", "b": None}, "annotations": {"x": "y"}}})
    assert changes_node(node, {"metadata": {"labels": {"a": "2"}}})
    assert changes_node(node, {"metadata": {"labels": {"a": None}}})
    assert changes_node(node, {"metadata": {"annotations": {"z": "1"}}})
