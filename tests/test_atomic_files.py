"""Temp files of shared state files: a writer killed mid-write leaves one, and only such leftovers are swept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dradriver.atomic_files import sweep_dead_writers, temp_file_for, write_atomically
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


def dead_pid() -> int:
    """The PID of a process that has exited (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_only_temp_files_of_writers_that_are_gone_are_removed(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{}")
    cut_short = tmp_path / f".state.json.{dead_pid()}.abc123.tmp"
    cut_short.write_text("{")
    fd, in_progress = temp_file_for(state)  # this process is alive: its write is in progress
    os.close(fd)
    other_file = tmp_path / f".other.json.{dead_pid()}.x.tmp"
    other_file.write_text("")
    assert sweep_dead_writers(state) == [cut_short]
    assert Path(in_progress).exists() and other_file.exists() and state.exists()


def test_a_simulated_node_sweeps_what_a_killed_writer_left(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    SimulatedNode(load_node_profile("mixed"), node_name="sim-node", state_path=state)  # writes the state
    leftover = tmp_path / f".sim.json.{dead_pid()}.k1ll3d.tmp"
    leftover.write_text('{"half": ')
    node = SimulatedNode(load_node_profile("mixed"), node_name="sim-node", state_path=state)
    assert not leftover.exists()
    assert len(node.gpus) == 6


def test_a_file_is_replaced_whole_and_no_temp_file_stays(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("old")
    write_atomically(state, "new")
    assert state.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
