"""NVIDIA's device plugin on the node: its kubelet socket or the Node's nvidia.com/ resources is a FAIL naming what
was seen and the fix; neither is OK saying what was looked at."""

from __future__ import annotations

from pathlib import Path

from dradriver.driver.checks.device_plugin import (
    FIX,
    advertised_resources,
    device_plugin_check,
    device_plugin_row,
    find_device_plugin,
    plugin_sockets,
)
from dradriver.driver.checks.settings import ClusterSettings, DevicePluginSettings


def kubelet_dir(tmp_path: Path, *names: str) -> Path:
    """A kubelet device-plugins directory holding files named ``names`` (the kubelet's own socket besides)."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    for name in ("kubelet.sock", "kubelet_internal_checkpoint", *names):
        (directory / name).touch()
    return directory


def node_with(capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "n"}, "status": {"capacity": capacity, "allocatable": allocatable or capacity}}


def test_the_plugins_sockets_are_named_for_each_resource_it_serves(tmp_path: Path) -> None:
    names = ("nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock", "nvidia-gpu.shared.sock")
    directory = kubelet_dir(tmp_path, *names, "amd.com_gpu.sock", "nvidia-.sock", "nvidia-gpu.sock.old")
    assert plugin_sockets(directory) == tuple(str(directory / n) for n in sorted(names))


def test_the_network_operators_nic_resources_and_sockets_are_not_the_gpu_plugin(tmp_path: Path) -> None:
    # NVIDIA's Network Operator advertises NICs under nvidia.com/ on GPUDirect GPU nodes: a healthy node, no plugin.
    nics = {"nvidia.com/hostdev": "4", "nvidia.com/sriov_rdma": "8", "nvidia.com/rdma_shared_device_a": "1"}
    assert advertised_resources(node_with({**nics, "nvidia.com/gpu.": "1", "nvidia.com/mig-": "1"})) == {}
    names = ("nvidia-hostdev.sock", "nvidia-sriov_rdma.sock", "nvidia-gpu..sock", "nvidia-mig-.sock")
    directory = kubelet_dir(tmp_path, *names, "nvidia.com_sriov_rdma.sock")
    assert plugin_sockets(directory) == ()
    settings = DevicePluginSettings(device_plugins_dir=directory, node_name="n")
    result = device_plugin_check(find_device_plugin(settings, lambda: node_with(nics)), settings)
    assert result.status == "OK"
    found = find_device_plugin(settings, lambda: node_with({**nics, "nvidia.com/gpu.shared": "16"}))
    assert found.resources == {"nvidia.com/gpu.shared": 16}


def test_no_directory_is_no_socket(tmp_path: Path) -> None:
    assert plugin_sockets(tmp_path / "missing") == ()


def test_the_nodes_nvidia_resources_above_zero_are_counted_with_the_larger_count() -> None:
    node = node_with(
        {"cpu": "64", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu.shared": "0"},
        {"cpu": "63500m", "nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb": "7"},
    )
    assert advertised_resources(node) == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7}
    assert advertised_resources({"status": {}}) == {} and advertised_resources({}) == {}


def test_a_socket_alone_fails_with_the_fix_and_says_why_the_node_was_not_read(tmp_path: Path) -> None:
    settings = DevicePluginSettings(device_plugins_dir=kubelet_dir(tmp_path, "nvidia-gpu.sock"))
    found = find_device_plugin(settings, None)
    assert found.found and found.node_unread == "no --node-name (NODE_NAME) to read it by"
    result = device_plugin_check(found, settings)
    assert result.status == "FAIL" and result.fix == FIX
    assert (
        result.detail
        == f"NVIDIA's device plugin is on this node: its kubelet socket {settings.device_plugins_dir}/nvidia-gpu.sock"
    )
    assert "nodeSelector" in result.fix and "--device-plugin-coexistence withhold" in result.fix


def test_the_nodes_capacity_alone_fails(tmp_path: Path) -> None:
    settings = DevicePluginSettings(device_plugins_dir=kubelet_dir(tmp_path), node_name="n")
    found = find_device_plugin(settings, lambda: node_with({"nvidia.com/gpu": "4"}))
    assert found.found and found.advertised_gpus == 4
    result = device_plugin_check(found, settings)
    assert result.status == "FAIL" and result.detail.endswith("the Node advertises nvidia.com/gpu: 4")


def test_a_node_that_cannot_be_read_leaves_the_socket_to_decide(tmp_path: Path) -> None:
    settings = DevicePluginSettings(device_plugins_dir=kubelet_dir(tmp_path), node_name="n")

    def unreachable() -> dict[str, object]:
        raise RuntimeError("GET /api/v1/nodes/n: HTTP 403: forbidden\nmore")

    found = find_device_plugin(settings, unreachable)
    assert not found.found and found.node_unread == "cannot read the Node: GET /api/v1/nodes/n: HTTP 403: forbidden"
    result = device_plugin_check(found, settings)
    assert result.status == "OK" and "Node not read (cannot read the Node" in result.detail


def test_neither_sign_is_ok_saying_what_was_looked_at(tmp_path: Path) -> None:
    settings = DevicePluginSettings(device_plugins_dir=kubelet_dir(tmp_path), node_name="n")
    result = device_plugin_check(find_device_plugin(settings, lambda: node_with({"cpu": "4"})), settings)
    assert result.status == "OK"
    assert result.detail == (
        f"no nvidia-gpu*.sock or nvidia-mig-*.sock in {settings.device_plugins_dir}; "
        "no nvidia.com/gpu* or nvidia.com/mig-* on the Node"
    )


def test_doctors_row_without_an_api_server_looks_at_the_sockets(tmp_path: Path) -> None:
    settings = DevicePluginSettings(device_plugins_dir=kubelet_dir(tmp_path, "nvidia-gpu.sock"), node_name="n")
    row = device_plugin_row(settings, ClusterSettings(endpoint=None, mig_mode="static"))
    assert row.name == "device plugin" and row.status == "FAIL"
    assert device_plugin_row(settings, None).status == "FAIL"
