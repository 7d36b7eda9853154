"""The committed protobuf code is current, and its wire names and field numbers are the kubelet's."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from dradriver.api.generated import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src" / "dradriver" / "api" / "generated"


def test_committed_generated_code_matches_the_protos(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-proto"), "--out", str(out)], check=True, capture_output=True
    )
    fresh = sorted(p.name for p in out.iterdir() if p.is_file())
    committed = sorted(p.name for p in GENERATED.iterdir() if p.is_file())
    assert fresh == committed, "run: python scripts/gen-proto"
    _, mismatch, errors = filecmp.cmpfiles(out, GENERATED, fresh, shallow=False)
    assert not mismatch and not errors, f"stale: {mismatch + errors}; run: python scripts/gen-proto"


def _method_paths(module: object) -> set[str]:
    paths = set()
    for service in module.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            paths.add(f"/{service.full_name}/{method.name}")
    return paths


def test_wire_method_paths_are_the_kubelets() -> None:
    dra = "k8s.io.kubelet.pkg.apis.dra"
    assert _method_paths(dra_v1_pb2) == {
        f"/{dra}.v1.DRAPlugin/NodePrepareResources",
        f"/{dra}.v1.DRAPlugin/NodeUnprepareResources",
    }
    assert _method_paths(dra_v1beta1_pb2) == {
        f"/{dra}.v1beta1.DRAPlugin/NodePrepareResources",
        f"/{dra}.v1beta1.DRAPlugin/NodeUnprepareResources",
    }
    assert _method_paths(pluginregistration_v1_pb2) == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }
    assert _method_paths(dra_health_v1alpha1_pb2) == {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}


def test_health_watch_is_server_streaming() -> None:
    method = dra_health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name[
        "NodeWatchResources"
    ]
    assert method.server_streaming and not method.client_streaming


def _fields(message: type) -> dict[str, tuple[int, int, bool]]:
    """name -> (number, type, repeated)."""
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.DESCRIPTOR.fields}


STRING, MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
BOOL, INT64, ENUM = FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_ENUM


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_dra_field_numbers(module: object) -> None:
    m = module
    assert _fields(m.Claim) == {"namespace": (1, STRING, False), "uid": (2, STRING, False), "name": (3, STRING, False)}
    assert _fields(m.NodePrepareResourcesRequest)["claims"] == (1, MESSAGE, True)
    assert _fields(m.NodePrepareResourcesResponse)["claims"][0] == 1
    claims_map = m.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert claims_map.message_type.GetOptions().map_entry
    assert _fields(m.NodePrepareResourceResponse) == {"devices": (1, MESSAGE, True), "error": (2, STRING, False)}
    assert _fields(m.NodeUnprepareResourcesRequest)["claims"] == (1, MESSAGE, True)
    assert _fields(m.NodeUnprepareResourcesResponse)["claims"][0] == 1
    assert _fields(m.NodeUnprepareResourceResponse) == {"error": (1, STRING, False)}
    device = {
        "request_names": (1, STRING, True),
        "pool_name": (2, STRING, False),
        "device_name": (3, STRING, False),
        "cdi_device_ids": (4, STRING, True),
    }
    if module is dra_v1_pb2:
        device["share_id"] = (5, STRING, False)
    assert _fields(m.Device) == device


def test_v1_share_id_is_proto3_optional() -> None:
    field = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert field.has_presence
    assert not dra_v1_pb2.Device().HasField("share_id")


def test_registration_field_numbers() -> None:
    assert _fields(pluginregistration_v1_pb2.PluginInfo) == {
        "type": (1, STRING, False),
        "name": (2, STRING, False),
        "endpoint": (3, STRING, False),
        "supported_versions": (4, STRING, True),
    }
    assert _fields(pluginregistration_v1_pb2.RegistrationStatus) == {
        "plugin_registered": (1, BOOL, False),
        "error": (2, STRING, False),
    }
    assert _fields(pluginregistration_v1_pb2.InfoRequest) == {}
    assert _fields(pluginregistration_v1_pb2.RegistrationStatusResponse) == {}


def test_health_field_numbers_and_enum() -> None:
    pb = dra_health_v1alpha1_pb2
    assert _fields(pb.NodeWatchResourcesRequest) == {}
    assert _fields(pb.NodeWatchResourcesResponse) == {"devices": (1, MESSAGE, True)}
    assert _fields(pb.DeviceIdentifier) == {"pool_name": (1, STRING, False), "device_name": (2, STRING, False)}
    assert _fields(pb.DeviceHealth) == {
        "device": (1, MESSAGE, False),
        "health": (2, ENUM, False),
        "last_updated_time": (3, INT64, False),
        "health_check_timeout_seconds": (4, INT64, False),
        "message": (5, STRING, False),
    }
    assert dict(pb.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
