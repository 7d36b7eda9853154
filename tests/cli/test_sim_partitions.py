"""`dradriver sim partitions`: Fabric Manager's partitions of a simulated HGX node, listed and changed out of band
as an admin's fmpm would, in the state a running driver shares (docs/partitions.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.cli.main import main


def sim(state: Path, *args: str) -> list[str]:
    return ["sim", "--sim-profile", "hgx-h100-80gb", "--sim-state", str(state), "partitions", *args]


def test_activation_is_listed_and_fms_refusal_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "sim.json"
    assert main(sim(state, "--activate", "3")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "GPUS", "ACTIVE", "MODULES"]
    assert out[4].split() == ["3", "2", "yes", "1,2"] and len(out) == 16
    assert main(sim(state, "--activate", "1")) != 0
    assert "GPUs are in use by active partition 3" in capsys.readouterr().err
    assert main(sim(state, "--deactivate", "3")) == 0
    assert all(line.split()[2] == "no" for line in capsys.readouterr().out.splitlines()[1:])
