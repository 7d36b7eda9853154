"""Per-claim CDI specs: names, content, minimum version, atomic replacement and removal."""

import json

import pytest

from dradriver.errors import DeviceError
from dradriver.gpu.models import DeviceNode
from dradriver.nvidia_install.cdi import CDI_KIND, CdiDevice, CdiWriter, ClaimSpec, minimum_cdi_version

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
GPU = CdiDevice(
    name="gpu-0000-07-00-0", device_nodes=(DeviceNode("/dev/nvidia0"),), env=("NVIDIA_VISIBLE_DEVICES=GPU-1",)
)


def test_spec_file_is_named_like_the_cdi_librarys_transient_specs(tmp_path):
    writer = CdiWriter(tmp_path)
    ids = writer.write(ClaimSpec(UID, (GPU,)))
    assert ids == [f"k8s.gpu.dradriver.dev/claim={UID}-gpu-0000-07-00-0"]
    assert writer.spec_path(UID).name == f"k8s.gpu.dradriver.dev-claim_{UID}.json"
    assert writer.claim_uids() == [UID]


def test_spec_holds_each_device_and_the_common_nodes(tmp_path):
    writer = CdiWriter(tmp_path, node_exists=lambda _path: True)
    writer.write(ClaimSpec(UID, (GPU,), env=("NVIDIA_VISIBLE_DEVICES=GPU-1",)))
    spec = json.loads(writer.spec_path(UID).read_text())
    assert spec["kind"] == CDI_KIND
    assert spec["devices"][0]["name"] == f"{UID}-gpu-0000-07-00-0"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert {"path": "/dev/nvidiactl"} in spec["containerEdits"]["deviceNodes"]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=GPU-1"]


def test_cdi_version_is_the_minimum_the_content_needs(tmp_path):
    letters = CdiWriter(tmp_path).render(ClaimSpec("abc", (GPU,)))
    assert letters["cdiVersion"] == "0.3.0"
    digits = CdiWriter(tmp_path).render(ClaimSpec(UID, (GPU,)))
    assert digits["cdiVersion"] == "0.5.0"  # a name starting with a digit
    host = CdiWriter(tmp_path, host_path=lambda _p: "/dev/null").render(ClaimSpec("abc", (GPU,)))
    assert host["cdiVersion"] == "0.5.0"
    assert host["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]
    assert minimum_cdi_version({**letters, "annotations": {"a": "b"}}) == "0.6.0"


def test_rewriting_replaces_the_spec_and_leaves_no_temp_files(tmp_path):
    writer = CdiWriter(tmp_path)
    writer.write(ClaimSpec(UID, (GPU,)))
    other = CdiDevice(name="gpu-0000-0f-00-0", device_nodes=(DeviceNode("/dev/nvidia1"),))
    writer.write(ClaimSpec(UID, (GPU, other)))
    spec = json.loads(writer.spec_path(UID).read_text())
    assert len(spec["devices"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == [writer.spec_path(UID).name]


def test_remove_is_idempotent(tmp_path):
    writer = CdiWriter(tmp_path)
    writer.write(ClaimSpec(UID, (GPU,)))
    writer.remove(UID)
    writer.remove(UID)
    assert writer.claim_uids() == []


def test_a_claim_without_devices_or_with_a_bad_name_is_refused(tmp_path):
    writer = CdiWriter(tmp_path)
    with pytest.raises(DeviceError, match="at least one"):
        writer.write(ClaimSpec(UID, ()))
    with pytest.raises(DeviceError, match="not valid"):
        writer.write(ClaimSpec(UID, (CdiDevice(name="bad name!", device_nodes=()),)))
    assert writer.claim_uids() == []


def test_unwritable_directory_names_the_flag_to_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DeviceError, match="--cdi-dir"):
        CdiWriter(blocker / "cdi").write(ClaimSpec(UID, (GPU,)))


def test_fully_described_nodes_carry_type_major_minor_and_mode(tmp_path):
    cap = DeviceNode("/dev/nvidia-caps/nvidia-cap30", major=508, minor=30, file_mode=0o444)
    spec = CdiWriter(tmp_path).render(ClaimSpec("abc", (CdiDevice("mig", (DeviceNode("/dev/nvidia0"), cap)),)))
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap30", "type": "c", "major": 508, "minor": 30, "fileMode": 0o444},
    ]
    assert spec["cdiVersion"] == "0.3.0"


def test_a_failed_write_leaves_no_temp_file_behind(tmp_path):
    writer = CdiWriter(tmp_path)
    writer.spec_path(UID).mkdir()  # the rename onto the spec's name fails
    for _ in range(2):  # the kubelet retries a failed prepare
        with pytest.raises(DeviceError, match="unable to write CDI spec"):
            writer.write(ClaimSpec(UID, (GPU,)))
    assert [p.name for p in tmp_path.iterdir()] == [writer.spec_path(UID).name]


def test_common_nodes_missing_on_the_host_are_left_out(tmp_path):
    writer = CdiWriter(tmp_path, node_exists=lambda path: path not in ("/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"))
    spec = writer.render(ClaimSpec("abc", (GPU,)))
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
