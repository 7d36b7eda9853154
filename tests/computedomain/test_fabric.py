"""The node's clique from NVML fabric info, and the IMEX device numbers from /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.computedomain.fabric import CHANNELS_DEVICE, clique_id, device_major, imex_mgmt_device
from dradriver.computedomain.imexconf import SENTINEL_ADDRESS, render_config, render_nodes, rewrite_hosts
from dradriver.errors import DeviceError
from dradriver.gpu.backend import open_gpu_backend, simulated_proc_root
from dradriver.gpu.models import FabricState

CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"


def test_a_gb200_tray_reads_its_clique() -> None:
    gpulib, _ = open_gpu_backend("sim", sim_profile="gb200-nvl72-tray")
    assert clique_id(gpulib) == CLIQUE


def test_a_node_without_multi_node_nvlink_has_no_clique() -> None:
    for profile in ("hgx-h200", "dgx-a100-80gb", "h100-nvl-pairs"):
        gpulib, _ = open_gpu_backend("sim", sim_profile=profile)
        assert clique_id(gpulib) == ""


@pytest.mark.parametrize(("state", "status", "message"), [
    (FabricState.IN_PROGRESS, 0, "IN_PROGRESS, not COMPLETED"),
    (FabricState.NOT_STARTED, 0, "NOT_STARTED, not COMPLETED"),
    (FabricState.COMPLETED, 3, "failed with NVML status 3"),
])  # fmt: skip
def test_a_fabric_not_registered_is_refused(tmp_path: Path, state: FabricState, status: int, message: str) -> None:
    gpulib, node = open_gpu_backend("sim", sim_profile="gb200-nvl72-tray", sim_state=tmp_path / "s.json")
    assert node is not None
    node.set_fabric_state(2, state, status)
    with pytest.raises(DeviceError, match=message):
        clique_id(gpulib)


def test_the_device_numbers_come_from_proc(tmp_path: Path) -> None:
    proc = simulated_proc_root(tmp_path / "proc")
    assert device_major(CHANNELS_DEVICE, proc) == 237
    device = imex_mgmt_device(proc)
    assert (device.path, device.major, device.minor, device.mode) == ("/dev/nvidia-caps/nvidia-cap1", 236, 1, 0o400)


def test_a_kernel_without_imex_channels_is_named(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text(
        "Character devices:\n195 nvidia-frontend\n\nBlock devices:\n237 nvidia-caps-imex-channels\n"
    )
    with pytest.raises(DeviceError, match="no character device 'nvidia-caps-imex-channels'"):
        device_major(CHANNELS_DEVICE, tmp_path)


def test_imex_files() -> None:
    config = render_config(pod_ip="10.1.2.3", nodes_file=Path("/imexd/nodes.cfg"))
    assert "IMEX_CMD_BIND_INTERFACE_IP=10.1.2.3\n" in config and "IMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg\n" in config
    assert render_nodes(3) == "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n"
    hosts = rewrite_hosts(
        "127.0.0.1\tlocalhost\n10.9.9.9\tcompute-domain-daemon-0007\n", {2: "10.0.0.3", 0: "10.0.0.1"}, max_nodes=4
    )
    # Every name resolves: a peer's to its address, an unused one to the sentinel (no DNS query, no stale peer).
    assert hosts == (
        "127.0.0.1\tlocalhost\n10.0.0.1\tcompute-domain-daemon-0000\n255.255.255.255\tcompute-domain-daemon-0001\n"
        "10.0.0.3\tcompute-domain-daemon-0002\n255.255.255.255\tcompute-domain-daemon-0003\n"
    )
    assert SENTINEL_ADDRESS == "255.255.255.255"


def test_the_node_facts_carry_a_fabric_problem_instead_of_failing(tmp_path: Path) -> None:
    from dradriver.computedomain.plugin import read_facts

    proc = simulated_proc_root(tmp_path / "proc")
    gpulib, node = open_gpu_backend("sim", sim_profile="gb200-nvl72-tray", sim_state=tmp_path / "s.json")
    assert node is not None
    facts = read_facts(gpulib, "tray", proc)
    assert (facts.clique_id, facts.channel_major, facts.problem) == (CLIQUE, 237, "")
    node.set_fabric_state(0, FabricState.IN_PROGRESS)
    assert "IN_PROGRESS, not COMPLETED" in read_facts(gpulib, "tray", proc).problem
