"""KEP-5304 device metadata: per-request files in the published layout, a CDI spec that mounts them read-only,
and a CDI id added only to the devices of that request."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cdi_schema import cdi_problems
from support.kubelet_plugin_fakes import DRIVER, FakeClaimSource, make_claim

from dradriver.plugin.handler import AllocatedClaim, ClaimRef, PreparedDevice, PrepareResult
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from dradriver.plugin.kubeletplugin.device_metadata import DeviceMetadataWriter
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor

UID = "0a1b2c3d-uid"
ATTRS = {"uuid": {"string": "GPU-1"}, "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"}}
CONTAINER = "/var/run/kubernetes.io/dra-device-attributes"


class MetadataHandler:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = ATTRS

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        out = {}
        for claim in claims:
            by_device: dict[str, list[str]] = {}
            for r in claim.devices:
                by_device.setdefault(r.device, []).append(r.request)
            out[claim.uid] = PrepareResult(
                devices=tuple(
                    PreparedDevice(
                        pool="node-a",
                        device=d,
                        requests=tuple(reqs),
                        cdi_device_ids=(f"k8s.{DRIVER}/claim={d}",),
                        metadata={**self.attributes, "name": {"string": d}},
                    )
                    for d, reqs in by_device.items()
                )
            )
        return out

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        return {ref.uid: None for ref in claims}


@pytest.fixture
def handler() -> MetadataHandler:
    return MetadataHandler()


@pytest.fixture
def processor(tmp_path: Path, handler: MetadataHandler, claims: FakeClaimSource) -> ClaimProcessor:
    writer = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=tmp_path / "plugin", cdi_dir=tmp_path / "cdi")
    return ClaimProcessor(
        driver_name=DRIVER, handler=handler, claim_source=claims, locks=ClaimLocks(), device_metadata=writer
    )


def two_request_claim(**annotations: str) -> dict[str, Any]:
    claim = make_claim(
        "c1",
        UID,
        results=[
            {"request": "first/big", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
            {"request": "second", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
            {"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "eth0"},
        ],
    )
    if annotations:
        claim["metadata"]["annotations"] = annotations
    return claim


def test_each_request_gets_its_file_and_only_its_devices_get_its_cdi_id(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    claims.add(two_request_claim())
    result = processor.prepare([ClaimRef("default", "c1", UID)])[UID]
    assert result.error is None
    ids = {d.device: d.cdi_device_ids for d in result.devices}
    assert ids["gpu-0"] == (f"k8s.{DRIVER}/claim=gpu-0", f"{DRIVER}/metadata={UID}_first")
    assert ids["gpu-1"] == (f"k8s.{DRIVER}/claim=gpu-1", f"{DRIVER}/metadata={UID}_second")

    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}-metadata_{UID}.json").read_text())
    assert cdi_problems(spec, max_version="0.5.0") == []
    mounts = {d["name"]: d["containerEdits"]["mounts"][0] for d in spec["devices"]}
    first = mounts[f"{UID}_first"]
    assert first["containerPath"] == f"{CONTAINER}/resourceclaims/c1/first/{DRIVER}-metadata.json"
    assert "ro" in first["options"]
    document = json.loads(Path(first["hostPath"]).read_text())
    assert document["apiVersion"] == "metadata.resource.k8s.io/v1alpha1" and document["kind"] == "DeviceMetadata"
    assert document["metadata"] == {"name": "c1", "namespace": "default", "uid": UID, "generation": 1}
    [request] = document["requests"]
    assert request["name"] == "first/big"  # the full name inside, the base name in the path
    assert request["devices"] == [
        {"driver": DRIVER, "pool": "node-a", "name": "gpu-0", "attributes": {**ATTRS, "name": {"string": "gpu-0"}}}
    ]
    assert Path(first["hostPath"]).stat().st_mode & 0o777 == 0o644


def test_a_claim_from_a_template_uses_the_pod_claim_name(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    claims.add(two_request_claim(**{"resource.kubernetes.io/pod-claim-name": "gpus"}))
    processor.prepare([ClaimRef("default", "c1", UID)])
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}-metadata_{UID}.json").read_text())
    paths = sorted(d["containerEdits"]["mounts"][0]["containerPath"] for d in spec["devices"])
    assert paths[0] == f"{CONTAINER}/resourceclaimtemplates/gpus/first/{DRIVER}-metadata.json"
    document = json.loads(Path(spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"]).read_text())
    assert document["podClaimName"] == "gpus"


def test_generation_grows_only_when_the_content_changes(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource, handler: MetadataHandler
) -> None:
    claims.add(two_request_claim())
    ref = ClaimRef("default", "c1", UID)
    host_file = tmp_path / "plugin/dra-device-metadata" / UID / "first/metadata.json"
    processor.prepare([ref])
    processor.prepare([ref])
    assert json.loads(host_file.read_text())["metadata"]["generation"] == 1
    handler.attributes = {"uuid": {"string": "GPU-2"}}
    processor.prepare([ref])
    assert json.loads(host_file.read_text())["metadata"]["generation"] == 2


def test_unprepare_removes_the_files_and_the_spec(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    claims.add(two_request_claim())
    ref = ClaimRef("default", "c1", UID)
    processor.prepare([ref])
    assert processor.unprepare([ref]) == {UID: None}
    assert not (tmp_path / "plugin/dra-device-metadata" / UID).exists()
    assert list((tmp_path / "cdi").iterdir()) == []
    assert processor.unprepare([ref]) == {UID: None}  # idempotent


def test_an_unwritable_metadata_directory_fails_the_claim_with_the_reason(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin/dra-device-metadata").write_text("not a directory")
    claims.add(two_request_claim())
    error = processor.prepare([ClaimRef("default", "c1", UID)])[UID].error
    assert error is not None and "device metadata of claim default/c1" in error


@pytest.mark.parametrize("request_name", ["../../../escaped", "..", "../x/y", "UPPER", "x" * 64])
def test_a_request_name_that_is_no_dns_label_fails_the_claim_and_writes_nothing(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource, request_name: str
) -> None:
    claims.add(
        make_claim(
            "c1", UID, results=[{"request": request_name, "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]
        )
    )
    error = processor.prepare([ClaimRef("default", "c1", UID)])[UID].error
    assert error is not None and "is not a DNS label" in error
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == []


def test_a_writer_turned_off_writes_nothing_but_still_removes_at_unprepare(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource, handler: MetadataHandler
) -> None:
    claims.add(two_request_claim())
    processor.prepare([ClaimRef("default", "c1", UID)])  # written while the feature was on
    off = DeviceMetadataWriter(
        driver_name=DRIVER, plugin_dir=tmp_path / "plugin", cdi_dir=tmp_path / "cdi", enabled=False
    )
    later = ClaimProcessor(
        driver_name=DRIVER, handler=handler, claim_source=claims, locks=ClaimLocks(), device_metadata=off
    )
    other = make_claim(
        "c2", "0a1b2c3d-two", results=[{"request": "r", "driver": DRIVER, "pool": "node-a", "device": "gpu-3"}]
    )
    claims.add(other)
    result = later.prepare([ClaimRef("default", "c2", "0a1b2c3d-two")])["0a1b2c3d-two"]
    assert result.error is None
    assert result.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim=gpu-3",)
    assert off.claim_uids() == {UID}
    assert later.unprepare([ClaimRef("default", "c1", UID)]) == {UID: None}
    assert off.claim_uids() == set()
    assert not (tmp_path / "plugin" / "dra-device-metadata" / UID).exists()


def test_remove_unowned_keeps_prepared_claims_and_touches_nothing_but_claim_uids(
    tmp_path: Path, processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    claims.add(two_request_claim())
    processor.prepare([ClaimRef("default", "c1", UID)])
    writer = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=tmp_path / "plugin", cdi_dir=tmp_path / "cdi")
    (tmp_path / "cdi" / f"{DRIVER}-metadata_gone-uid.json").write_text("{}")
    (tmp_path / "plugin" / "dra-device-metadata" / "other-gone" / "r").mkdir(parents=True)
    (tmp_path / "cdi" / f"{DRIVER}-metadata_...json").write_text("{}")  # no claim UID: not ours to judge
    (tmp_path / "cdi" / "k8s.gpu.dradriver.dev-claim_gone-uid.json").write_text("{}")  # the driver's own spec
    assert writer.remove_unowned([UID]) == ["gone-uid", "other-gone"]
    assert writer.claim_uids() == {UID}
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [
        f"{DRIVER}-metadata_...json",
        f"{DRIVER}-metadata_{UID}.json",
        "k8s.gpu.dradriver.dev-claim_gone-uid.json",
    ]
    assert writer.remove_unowned([]) == [UID]
