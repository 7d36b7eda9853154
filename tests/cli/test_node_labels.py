"""`dradriver node-labels show` prints GFD's labels for a simulated node; `node-labels remove` takes the driver's
labels off nodes (through the API-server stand-in) and leaves every other label alone."""

from __future__ import annotations

import json

import pytest
from support.apiserver import FakeApiServer

from dradriver.cli.main import main

ANNOTATION = "gpu.dradriver.dev/node-labels"


def show(capsys, *args: str) -> str:
    assert main(["node-labels", "show", "--gpu-backend", "sim", *args]) == 0
    return capsys.readouterr().out


def test_show_prints_sorted_key_value_lines(capsys):
    out = show(capsys, "--sim-profile", "hgx-h100-80gb")
    lines = out.splitlines()
    assert lines == sorted(lines)
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in lines
    assert "nvidia.com/gpu.machine=unknown" in lines  # a simulated node has no host to read
    assert "nvidia.com/gpu.mode=unknown" in lines


def test_show_json_and_the_mig_strategy(capsys):
    labels = json.loads(show(capsys, "--sim-profile", "mixed", "--node-labels-mig-strategy", "mixed", "-o", "json"))
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"


def test_show_says_mps_capable_with_mps_sharing(capsys):
    assert "nvidia.com/mps.capable=true" in show(
        capsys, "--sim-profile", "hgx-h100-80gb", "--gpu-sharing", "consumable"
    )


def test_show_takes_the_strategy_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("DRADRIVER_NODE_LABELS_MIG_STRATEGY", "single")
    assert "nvidia.com/mig.strategy=single" in show(capsys, "--sim-profile", "hgx-h100-80gb")


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def a_node(api: FakeApiServer, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
    api.create("nodes", {"metadata": {"name": name, "labels": labels, "annotations": annotations}})


def test_remove_all_nodes_takes_off_what_each_annotation_lists(api, tmp_path, capsys):
    ours = {"nvidia.com/gpu.product": "X", "nvidia.com/gpu.count": "2"}
    a_node(api, "node-a", {**ours, "team": "a"}, {ANNOTATION: ",".join(sorted(ours))})
    a_node(api, "node-b", ours, {ANNOTATION: "nvidia.com/gpu.count"})
    a_node(api, "node-c", {"nvidia.com/gpu.product": "theirs"}, {})
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    assert main(["node-labels", "remove", "--all-nodes", "--kubeconfig", kubeconfig]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"node/node-a: removed 2 labels and the annotation {ANNOTATION}",
        f"node/node-b: removed 1 labels and the annotation {ANNOTATION}",
    ]
    assert api.get("nodes", "node-a")["metadata"]["labels"] == {"team": "a"}
    assert api.get("nodes", "node-b")["metadata"]["labels"] == {"nvidia.com/gpu.product": "X"}
    assert api.get("nodes", "node-c")["metadata"]["labels"] == {"nvidia.com/gpu.product": "theirs"}
    assert ANNOTATION not in (api.get("nodes", "node-a")["metadata"].get("annotations") or {})


def test_remove_named_nodes_only_and_by_another_driver_name(api, tmp_path, capsys):
    a_node(api, "node-a", {"nvidia.com/gpu.count": "2"}, {"other.example.com/node-labels": "nvidia.com/gpu.count"})
    a_node(api, "node-b", {"nvidia.com/gpu.count": "2"}, {"other.example.com/node-labels": "nvidia.com/gpu.count"})
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    args = ["node-labels", "remove", "node-a", "--driver-name", "other.example.com", "--kubeconfig", kubeconfig]
    assert main(args) == 0
    assert capsys.readouterr().out == "node/node-a: removed 1 labels and the annotation other.example.com/node-labels\n"
    assert "nvidia.com/gpu.count" not in (api.get("nodes", "node-a")["metadata"].get("labels") or {})
    assert api.get("nodes", "node-b")["metadata"]["labels"] == {"nvidia.com/gpu.count": "2"}


def test_remove_needs_nodes_or_all_nodes_but_not_both(tmp_path, capsys):
    assert main(["node-labels", "remove"]) == 2
    assert "--all-nodes" in capsys.readouterr().err
    assert main(["node-labels", "remove", "node-a", "--all-nodes"]) == 2


def test_remove_of_a_node_that_is_not_there_fails_naming_it(api, tmp_path, capsys):
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    assert main(["node-labels", "remove", "gone", "--kubeconfig", kubeconfig]) == 2
    err = capsys.readouterr().err
    assert "node/gone: cannot remove the labels" in err
    assert "the labels stay on gone" in err


class RecordingLabeler:
    def __init__(self) -> None:
        self.updated: list[str] = []
        self.removed = 0

    def update(self, inventory) -> bool:
        self.updated.append(inventory.driver_version)
        return True

    def remove(self) -> None:
        self.removed += 1


def rescanner_on(tmp_path, monkeypatch, *, enabled: bool, driver_version: str):
    """A Rescanner over a simulated node whose slices are already published as discovery will find them, the
    driver root at ``driver_version`` (another than the node's: an in-place upgrade) and a recording labeler."""
    import threading
    from dataclasses import replace
    from types import SimpleNamespace

    from dradriver.cli import node_loops
    from dradriver.cli.flags.node_labels import NodeLabelOptions
    from dradriver.cli.run_assembly import pools_of
    from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
    from dradriver.gpu.inventory import MigMode, discover
    from dradriver.sim.fakelib import simulated_gpulib

    gpulib, _ = simulated_gpulib("hgx-h100-80gb", node_name="node-a")
    inventory = discover(gpulib)
    settings = SliceSettings()
    monkeypatch.setattr(node_loops, "offered", lambda _options, _cluster, fresh, _watch: fresh)
    monkeypatch.setattr(node_loops.Rescanner, "follow_driver_upgrade", lambda self, version: None)
    node = SimpleNamespace(
        name="node-a",
        options=SimpleNamespace(
            gpus=SimpleNamespace(mig_mode=MigMode.STATIC), node_labels=NodeLabelOptions(enabled=enabled)
        ),
        gpus=SimpleNamespace(
            lib=gpulib,
            inventory=replace(inventory, driver_version=driver_version),
            driver_root=SimpleNamespace(version=driver_version),
            pci=None,  # no --passthrough
        ),
        health=SimpleNamespace(update_inventory=lambda *_: None, taints=lambda _device: []),
        driver=SimpleNamespace(passthrough_devices=lambda: [], partitions=None),  # no --fabric-manager-partitions
        cluster=None,
        plugin_watch=None,
        settings=settings,
        pools=pools_of("node-a", build_slice_specs(inventory, settings)),
        labeler=RecordingLabeler(),
    )
    return node_loops.Rescanner(node, threading.Event()), node.labeler


def test_a_rescan_labels_the_node_also_when_the_slices_did_not_change(tmp_path, monkeypatch):
    rescanner, labeler = rescanner_on(tmp_path, monkeypatch, enabled=True, driver_version="570.10.01")
    rescanner.label_node()  # at start: the inventory found at start
    rescanner.rescan()  # the same slices, another driver version: the labels follow it
    assert labeler.updated == ["570.10.01", "580.65.06"]
    assert labeler.removed == 0


def test_with_node_labels_none_the_start_removes_and_rescans_label_nothing(tmp_path, monkeypatch):
    rescanner, labeler = rescanner_on(tmp_path, monkeypatch, enabled=False, driver_version="580.65.06")
    rescanner.label_node()
    rescanner.rescan()
    assert (labeler.updated, labeler.removed) == ([], 1)
