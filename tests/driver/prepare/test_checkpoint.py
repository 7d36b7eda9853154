"""The checkpoint file: atomic, checksummed, versioned; bad files never stop the driver for good."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from dradriver.driver.prepare.checkpoint import (
    FILE_NAME,
    CheckpointStore,
    CheckpointVersionError,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
    checksum,
)
from dradriver.plugin.kubeletplugin.lifecycle import AlreadyRunningError


def record(uid: str = "u1") -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state=ClaimState.PREPARE_COMPLETED,
        devices=[
            DeviceRecord(
                name="gpu-0-mig-1g10gb-0",
                requests=["r"],
                gpu="gpu-0",
                gpu_uuid="GPU-1",
                kind="mig",
                placement_start=0,
                placement_size=1,
                profile_id=19,
                gpu_instance_id=7,
                compute_instance_id=0,
                mig_uuid="MIG-1",
                previous_mig_mode=False,
                cdi_device_ids=["k8s.gpu.dradriver.dev/claim=u1-gpu-0-mig-1g10gb-0"],
            )
        ],
    )


def write_doc(state: Path, doc: dict) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    path = state / FILE_NAME
    path.write_text(json.dumps(doc))
    return path


def saved(tmp_path: Path) -> dict:
    store = CheckpointStore.open(tmp_path, boot_id="b1")
    store.put(record())
    store.close()
    return json.loads((tmp_path / FILE_NAME).read_text())


def test_records_survive_a_restart_exactly(tmp_path: Path):
    store = CheckpointStore.open(tmp_path, boot_id="b1")
    store.put(record())
    store.close()
    again = CheckpointStore.open(tmp_path, boot_id="b1")
    assert again.records() == [record()]
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert doc["version"] == "1.0" and doc["data"]["bootId"] == "b1"
    assert doc["checksum"] == checksum(doc["data"])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_second_process_cannot_open_the_same_checkpoint(tmp_path: Path):
    first = CheckpointStore.open(tmp_path, boot_id="b1")
    with pytest.raises(AlreadyRunningError, match="already running"):
        CheckpointStore.open(tmp_path, boot_id="b1")
    first.close()
    CheckpointStore.open(tmp_path, boot_id="b1").close()


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"kind": "dradriver-checkpoint", "version": "1.0", "checksum": "sha256:00", "data": {"claims": {}}}',
        '{"kind": "something-else"}',
        '{"kind": "dradriver-checkpoint", "version": "1.0", "data": {"claims": {"u": {"state": "Weird"}}}}',
    ],
    ids=["bad-json", "checksum-mismatch", "wrong-kind", "malformed-claim"],
)
def test_a_corrupt_checkpoint_is_moved_aside_with_one_log_line_and_rebuilt(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
):
    (tmp_path / FILE_NAME).write_text(content)
    with caplog.at_level(logging.ERROR):
        store = CheckpointStore.open(tmp_path, boot_id="b1")
    assert store.records() == []
    assert [r.message for r in caplog.records if "moved aside" in r.message]
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_text() == content
    store.put(record())  # and the driver carries on with a fresh file
    store.close()
    assert CheckpointStore.open(tmp_path, boot_id="b1").records() == [record()]


def test_a_truncated_checkpoint_is_moved_aside(tmp_path: Path):
    text = json.dumps(saved(tmp_path))
    (tmp_path / FILE_NAME).write_text(text[: len(text) // 2])
    assert CheckpointStore.open(tmp_path, boot_id="b1").records() == []
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())


def test_a_newer_minor_version_is_read_and_its_unknown_fields_kept_on_rewrite(tmp_path: Path):
    doc = saved(tmp_path)
    doc["version"] = "1.7"
    doc["data"]["nodeFeature"] = {"added": "in 1.7"}
    doc["data"]["claims"]["u1"]["priority"] = 3
    doc["data"]["claims"]["u1"]["devices"][0]["computeMode"] = "EXCLUSIVE_PROCESS"
    doc["data"]["claims"]["u1"]["actions"] = [
        {"step": "compute-mode", "device": "x", "params": {}, "done": True, "undoHint": "reset"}
    ]
    doc["checksum"] = checksum(doc["data"])
    write_doc(tmp_path, doc)
    store = CheckpointStore.open(tmp_path, boot_id="b1")
    [read] = store.records()
    assert read.devices[0].mig_uuid == "MIG-1"
    store.put(read)
    store.put(record("u2"))
    store.close()
    data = json.loads((tmp_path / FILE_NAME).read_text())["data"]
    assert data["nodeFeature"] == {"added": "in 1.7"}
    assert data["claims"]["u1"]["priority"] == 3
    assert data["claims"]["u1"]["devices"][0]["computeMode"] == "EXCLUSIVE_PROCESS"
    assert data["claims"]["u1"]["actions"][0]["undoHint"] == "reset"


def test_an_older_file_without_optional_fields_is_read_with_defaults(tmp_path: Path):
    data = {
        "bootId": "b1",
        "claims": {
            "u1": {
                "namespace": "default",
                "name": "claim-u1",
                "state": "PrepareCompleted",
                "devices": [{"name": "gpu-0", "gpu": "gpu-0", "gpuUUID": "GPU-1", "kind": "gpu"}],
            }
        },
    }
    write_doc(tmp_path, {"kind": "dradriver-checkpoint", "version": "1.0", "checksum": checksum(data), "data": data})
    [read] = CheckpointStore.open(tmp_path, boot_id="b1").records()
    assert read.actions == [] and read.devices[0].cdi_device_ids == [] and read.devices[0].mig_uuid is None


@pytest.mark.parametrize("version", ["2.0", "0.9"])
def test_an_unknown_major_version_is_refused_and_the_file_left_untouched(tmp_path: Path, version: str):
    doc = saved(tmp_path)
    doc["version"] = version
    path = write_doc(tmp_path, doc)
    before = path.read_bytes()
    with pytest.raises(CheckpointVersionError, match=f"format version {version}.*left untouched"):
        CheckpointStore.open(tmp_path, boot_id="b1")
    assert path.read_bytes() == before
    with pytest.raises(CheckpointVersionError):  # refused again, not "in use": the lock was released
        CheckpointStore.open(tmp_path, boot_id="b1")


def test_a_checkpoint_from_an_earlier_boot_is_discarded(tmp_path: Path):
    saved(tmp_path)
    store = CheckpointStore.open(tmp_path, boot_id="b2")
    assert store.records() == [] and [r.uid for r in store.discarded] == ["u1"]
    assert json.loads((tmp_path / FILE_NAME).read_text())["data"] == {"bootId": "b2", "claims": {}}


def test_shared_stores_of_a_rolling_update_see_each_others_writes(tmp_path: Path):
    old = CheckpointStore.open(tmp_path, boot_id="b1", shared=True)
    new = CheckpointStore.open(tmp_path, boot_id="b1", shared=True)
    old.put(record("u1"))
    assert [r.uid for r in new.records()] == ["u1"]
    new.put(record("u2"))
    old.remove("u1")
    assert [r.uid for r in new.records()] == ["u2"] and [r.uid for r in old.records()] == ["u2"]


def test_the_state_directory_and_the_checkpoint_are_owner_only(tmp_path: Path) -> None:
    store = CheckpointStore.open(tmp_path / "state", boot_id="b")
    try:
        store.put(ClaimRecord(uid="u", namespace="ns", name="c", state=ClaimState.PREPARE_COMPLETED))
        assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
        for path in (tmp_path / "state").iterdir():
            assert path.stat().st_mode & 0o077 == 0, path
    finally:
        store.close()


def test_a_checkpoint_deleted_with_its_directory_is_written_back_from_memory_with_its_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default state directory is the plugin directory; deleting it under a running driver must not make
    it forget its prepared claims (their MIG instances and CDI specs would then never be undone)."""
    state = tmp_path / "plugin"
    store = CheckpointStore.open(state, boot_id="b1")
    store.put(record("u1"))
    shutil.rmtree(state)
    store.ensure_written()
    assert "checkpoint was deleted under the running driver" in caplog.text
    assert [r.uid for r in store.records()] == ["u1"]
    assert "u1" in json.loads((state / FILE_NAME).read_text())["data"]["claims"]
    with pytest.raises(AlreadyRunningError):
        CheckpointStore.open(state, boot_id="b1")  # the directory's lock was taken again
    store.put(record("u2"))
    store.close()
    assert sorted(r.uid for r in CheckpointStore.open(state, boot_id="b1").records()) == ["u1", "u2"]
