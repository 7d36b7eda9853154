"""The memory-slice map shown by `dradriver inventory` and `dradriver sim show`."""

from __future__ import annotations

from pathlib import Path

from dradriver.cli.main import main
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.driver.publish.slice_map import InstanceCell, owners_from_checkpoint, render
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef
from dradriver.sim.fakelib import simulated_gpulib


def test_the_map_marks_each_instances_slices_and_names_its_claim():
    lines = render(
        "GPU-1",
        [InstanceCell(5, "1g.10gb", 4, 1), InstanceCell(1, "3g.40gb", 0, 4)],
        {("GPU-1", 1): "default/train (UID u1)"},
    )
    assert lines == [
        "memory slices  0 1 2 3 4 5 6 7",
        "               A A A A B . . .",
        "  A  GI 1  3g.40gb     slices 0-3  claim default/train (UID u1)",
        "  B  GI 5  1g.10gb     slice 4     not owned by a claim",
    ]


def test_sim_show_and_inventory_draw_the_map_with_owners_from_the_checkpoint(tmp_path: Path, capsys):
    state, sim = tmp_path / "state", tmp_path / "sim.json"
    gpulib, _ = simulated_gpulib("hgx-h100-80gb", node_name="node-a", state_path=sim)
    store = CheckpointStore.open(state, boot_id="b")
    driver = GpuDriver(
        GpuDriverOptions(driver_name="gpu.dradriver.dev", pool="node-a", mig_mode=MigMode.DYNAMIC),
        inventory=discover(gpulib),
        cdi=CdiWriter(tmp_path / "cdi"),
        gpulib=gpulib,
        checkpoint=store,
    )
    claim = AllocatedClaim(
        ClaimRef("default", "train", "u1"), (AllocatedDevice("r", "node-a", "gpu-0000-1b-00-0-mig-2g20gb-2"),)
    )
    assert driver.prepare_resource_claims([claim])["u1"].error is None
    assert set(owners_from_checkpoint(state).values()) == {"default/train (UID u1)"}
    common = ["--sim-profile", "hgx-h100-80gb", "--node-name", "node-a", "--sim-state", str(sim)]
    assert main(["sim", *common, "show", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert ". . A A . . . ." in out and "claim default/train (UID u1)" in out
    assert main(["inventory", "--gpu-backend", "sim", *common, "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "gpu-0000-1b-00-0 (MIG enabled)" in out and "claim default/train (UID u1)" in out
    store.close()
