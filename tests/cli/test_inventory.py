"""`dradriver inventory` as users call it: formats, environment variables and error paths."""

import json
import subprocess
import sys

import yaml

from dradriver.cli.main import main


def dradriver(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "dradriver", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_json_lists_the_dgx_a100_80gb_with_profiles_and_placements():
    done = dradriver("inventory", "--gpu-backend", "sim", "--sim-profile", "dgx-a100-80gb", "-o", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert len(document["gpus"]) == 8
    first = document["gpus"][0]
    assert first["name"] == "gpu-0000-07-00-0"
    assert first["productName"] == "NVIDIA A100-SXM4-80GB"
    assert first["memoryBytes"] == 85899345920
    assert first["pciBusId"] == "0000:07:00.0"
    assert first["numaNode"] == 0
    assert {g["nvlinkDomain"] for g in document["gpus"]} == {"nvswitch-0000-07-00-0"}
    profiles = {p["name"]: p for p in first["migProfiles"]}
    assert [pl["start"] for pl in profiles["1g.10gb"]["placements"]] == [0, 1, 2, 3, 4, 5, 6]
    assert profiles["7g.80gb"]["id"] == 0


def test_flags_come_from_environment_variables():
    done = dradriver(
        "inventory",
        "-o",
        "yaml",
        env={
            "DRADRIVER_GPU_BACKEND": "sim",
            "DRADRIVER_SIM_PROFILE": "mixed",
            "DRADRIVER_MIG_MODE": "none",
            "NODE_NAME": "node-x",
        },
    )
    assert done.returncode == 0, done.stderr
    document = yaml.safe_load(done.stdout)
    assert document["node"] == "node-x"
    assert document["migMode"] == "none"
    assert len(document["offeredDevices"]) == 5


def test_slices_output_is_a_multi_document_stream_of_resource_slices(capsys):
    assert (
        main(
            [
                "inventory",
                "--gpu-backend",
                "sim",
                "--sim-profile",
                "hgx-h100-80gb",
                "--mig-mode",
                "dynamic",
                "-o",
                "slices",
            ]
        )
        == 0
    )
    slices = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(slices) == 9
    assert all(s["kind"] == "ResourceSlice" for s in slices)


def test_missing_nvml_is_one_line_and_exit_2():
    done = dradriver("inventory", "--gpu-backend", "nvml")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dradriver inventory: error: nvmlInit: NVML library not found: install the NVIDIA driver or use "
        "--gpu-backend sim"
    ]
    assert "Traceback" not in done.stderr


def test_bad_profiles_and_state_files_are_one_clear_error(tmp_path, capsys):
    assert main(["inventory", "--gpu-backend", "sim", "--sim-profile", "dgx-z"]) == 2
    assert "unknown simulated node profile 'dgx-z'" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ngpus:\n  - {product: NVIDIA L4, pciBusId: '0000:07:00.0', migEnabled: true}\n")
    assert main(["inventory", "--gpu-backend", "sim", "--sim-profile", str(broken)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "does not support MIG" in err

    state = tmp_path / "state.json"
    state.write_text("{not json")
    assert main(["inventory", "--gpu-backend", "sim", "--sim-state", str(state)]) == 2
    assert f"simulated GPU state file {state}" in capsys.readouterr().err
    assert state.read_text() == "{not json"
