"""`dradriver sim`: an admin's nvidia-smi for a simulated node, acting on the shared state file."""

from pathlib import Path

import pytest

from dradriver.cli.main import main
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


def sim(state: Path, *args: str) -> int:
    return main(["sim", "--sim-profile", "mixed", "--sim-state", str(state), *args])


def test_carving_a_mig_device_on_an_ampere_gpu_takes_enable_reset_create(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "mig-mode", "0000:0f:00.0", "enable") == 0
    assert "pending" in capsys.readouterr().out
    assert sim(state, "reset", "0000:0f:00.0") == 0
    assert sim(state, "mig-create", "1", "3g.20gb", "--start", "4") == 0
    assert "3g.20gb at slice 4" in capsys.readouterr().out
    node = SimulatedNode(load_node_profile("mixed"), state_path=state)
    assert [(gi.profile.name, gi.placement.start) for gi, _ in node.mig_devices(1)] == [("3g.20gb", 4)]
    assert sim(state, "show") == 0
    assert "GI 1  3g.20gb     slices 4-7" in capsys.readouterr().out


def test_destroying_a_gpu_instance_frees_its_slices(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "mig-destroy", "0000:07:00.0", "1") == 0
    assert sim(state, "mig-create", "0", "3g.20gb", "--start", "0") == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("mig-create", "0", "3g.20gb", "--start", "0"), "(NVML error 23)"),
        (("mig-create", "4", "1g.5gb"), "NVIDIA L4 has no MIG profile"),
        (("mig-create", "0000:99:00.0", "1g.5gb"), "no GPU '0000:99:00.0'"),
        (("compute-mode", "1", "EXCLUSIVE_THREAD"), "no longer supported"),
    ],
)
def test_refusals_are_one_clear_line(tmp_path, capsys, args, message):
    assert sim(tmp_path / "state.json", *args) == 2
    assert message in capsys.readouterr().err


def test_the_state_file_is_required(capsys, monkeypatch):
    monkeypatch.delenv("DRADRIVER_SIM_STATE", raising=False)
    assert main(["sim", "show"]) == 2
    assert "--sim-state is required" in capsys.readouterr().err


def test_a_lost_gpu_shows_as_lost_and_refuses_work(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "lose", "2") == 0
    assert sim(state, "show") == 0
    assert "0000:47:00.0  NVIDIA A100-SXM4-40GB" in (out := capsys.readouterr().out) and "MIG lost" in out
    assert sim(state, "mig-mode", "2", "enable") == 2
    assert "fallen off the bus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("xid", "0", "0"), "argument xid: XID 0 is out of range: use 1 to 999"),
        (("xid", "0", "-5"), "XID -5 is out of range"),
        (("xid", "0", "99999999999999999999"), "is out of range"),
        (("xid", "0", "seventy"), "'seventy' is not a whole number"),
        (("mig-create", "1", "1g.10gb", "--start", "-3"), "argument --start: -3 is negative"),
        (("mig-destroy", "1", "-1"), "argument gpu_instance: -1 is negative"),
        (("xid", "99", "79"), "no GPU '99' on this simulated node"),
    ],
)
def test_values_are_checked_before_the_state_is_touched(tmp_path, capsys, args, message):
    state = tmp_path / "state.json"
    assert sim(state, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not state.exists()


def test_showing_creates_no_state_file(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "show") == 0
    assert "0000:0f:00.0" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_inventory_of_a_simulated_node_creates_no_state_file(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert main(["inventory", "--gpu-backend", "sim", "--sim-profile", "mixed", "--sim-state", str(state)]) == 0
    assert not state.exists()


def test_a_state_file_of_another_node_is_refused(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim_on(state, "node-a", "lose", "1") == 0
    before = state.read_bytes()
    assert sim_on(state, "node-b", "show") == 2
    assert "node: written for node 'node-a', not 'node-b' (check --node-name)" in capsys.readouterr().err
    assert state.read_bytes() == before


def sim_on(state: Path, node: str, *args: str) -> int:
    return main(["sim", "--sim-profile", "mixed", "--sim-state", str(state), "--node-name", node, *args])


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("/dev/zero", "--sim-state /dev/zero: not a regular file"),
        ("/", "--sim-state /: not a regular file"),
    ],
)
def test_a_state_path_that_is_not_a_file_is_refused(capsys, state, message):
    assert main(["sim", "--sim-state", state, "show"]) == 2
    assert message in capsys.readouterr().err


def test_a_state_file_that_is_not_json_is_refused_and_kept(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_bytes(b"\xff\xfe")
    assert sim(state, "show") == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    assert state.read_bytes() == b"\xff\xfe"


@pytest.mark.parametrize("flag", ["--sim-state", "--sim-profile"])
def test_a_path_too_long_to_look_up_is_one_error(tmp_path, capsys, flag):
    args = {"--sim-state": str(tmp_path / "s.json"), "--sim-profile": "mixed", flag: "x" * 5000}
    assert main(["sim", *(item for pair in args.items() for item in pair), "show"]) == 2
    assert "cannot look it up: File name too long" in capsys.readouterr().err


def test_a_state_file_that_cannot_be_written_is_one_error(capsys):
    # /proc takes no new files, even for root (whom permission checks would let through).
    assert main(["sim", "--sim-state", "/proc/dradriver-test/state.json", "lose", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sim-state /proc/" in err


def test_ecc_errors_are_counted_and_a_reset_brings_a_lost_gpu_back(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "ecc", "1", "--count", "3") == 0
    assert "3 double-bit ECC error(s) on 0000:0f:00.0: 3 since the last reset" in capsys.readouterr().out
    assert sim(state, "ecc", "1", "--count", "0") == 2
    assert "--count 0" in capsys.readouterr().err
    assert sim(state, "lose", "2") == 0
    assert sim(state, "reset", "2") == 0
    assert "reset 0000:47:00.0 (back on the bus)" in capsys.readouterr().out
    node = SimulatedNode(load_node_profile("mixed"), node_name="sim-node", state_path=state)
    assert node.gpu(2).index == 2 and node.ecc_errors(1, volatile=True) == 3


def test_an_unattributable_loss_leaves_the_gpu_answering(tmp_path, capsys):
    state = tmp_path / "state.json"
    assert sim(state, "lose", "2", "--unattributable") == 0
    assert "NVML cannot say which GPU" in capsys.readouterr().out
    assert sim(state, "show") == 0
    assert "MIG lost" not in capsys.readouterr().out


def test_a_process_started_on_a_gpu_shows_in_nvml_until_it_ends(tmp_path, capsys):
    state = tmp_path / "sim.json"
    assert sim(state, "process", "0000:0f:00.0", "4242", "--memory-mib", "2048", "--utilization", "70") == 0
    assert "process 4242 runs on GPU-" in capsys.readouterr().out
    node = SimulatedNode(load_node_profile("mixed"), node_name="sim-node", state_path=state)
    assert [(p.pid, p.memory_bytes, p.utilization_percent) for p in node.processes_on(1)] == [(4242, 2 << 30, 70)]
    assert sim(state, "process-end", "4242") == 0
    assert node.processes_on(1) == []
    assert sim(state, "process", "MIG-00000000-0000-0000-0000-000000000000", "1") == 2
    assert "no GPU or MIG device with UUID" in capsys.readouterr().err
