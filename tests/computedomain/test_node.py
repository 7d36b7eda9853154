"""The node side of ComputeDomains: channel and daemon prepare, the node label, the wait for the daemon."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.fake_rest import FakeRest

from dradriver.computedomain import api
from dradriver.computedomain.fabric import CharDevice
from dradriver.computedomain.kube import path_of
from dradriver.computedomain.node import ComputeDomainDriver, NodeFacts, slice_devices
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef, DeviceConfig, PrepareResult
from dradriver.plugin.kubeletplugin.lifecycle import SerializedHandler

NODE = "tray-a"
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"
UID = "cd-uid-1"
NODE_PATH = path_of("v1", "nodes", None, NODE)
CLIQUE_PATH = path_of(api.API_VERSION, "computedomaincliques", "dradriver", f"{UID}.{CLIQUE}")


def node_and_domain() -> FakeRest:
    """An API server stand-in with this node's Node and the ComputeDomain team/job (uid ``UID``)."""
    rest = FakeRest()
    rest.put(NODE_PATH, {"metadata": {"name": NODE}})
    rest.put(
        path_of(api.API_VERSION, "computedomains", "team", "job"),
        {"metadata": {"name": "job", "namespace": "team", "uid": UID}, "spec": {}},
    )
    return rest


@pytest.fixture
def rest() -> FakeRest:
    return node_and_domain()


def _driver(rest: FakeRest, tmp_path: Path, clique: str = CLIQUE) -> ComputeDomainDriver:
    facts = NodeFacts(NODE, clique, 237, CharDevice("/dev/nvidia-caps/nvidia-cap1", 236, 1, 0o400))
    return ComputeDomainDriver(
        facts=facts,
        rest=rest,  # type: ignore[arg-type]
        namespace="dradriver",
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
    )


def _claim(uid: str, device: str, parameters: dict[str, Any], namespace: str = "team") -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef(namespace, f"claim-{uid}", uid),
        devices=(AllocatedDevice(request="channel", pool=NODE, device=device),),
        config=(DeviceConfig("FromClaim", ("channel",), parameters),),
    )


def _ready(rest: FakeRest, status: str = "Ready") -> None:
    rest.put(CLIQUE_PATH, {"metadata": {"name": f"{UID}.{CLIQUE}"}, "daemons": [{"nodeName": NODE, "status": status}]})


def _spec(tmp_path: Path, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_{uid}.json").read_text())
    return spec


def test_the_slice_offers_one_channel_and_one_daemon_with_the_clique() -> None:
    devices = slice_devices(CLIQUE)
    assert [d["name"] for d in devices] == ["channel-0", "daemon-0"]
    assert devices[0]["attributes"] == {"type": {"string": "channel"}, "id": {"int": 0}, "cliqueID": {"string": CLIQUE}}


@pytest.mark.parametrize(("mode", "count"), [("Single", 1), ("All", api.MAX_IMEX_CHANNELS)])
def test_a_channel_is_injected_once_the_daemon_is_ready(rest: FakeRest, tmp_path: Path, mode: str, count: int) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest)
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, mode))])["c1"]
    assert result.error is None
    assert result.devices[0].cdi_device_ids == (f"{api.CDI_VENDOR}/claim=c1-channel-0",)
    nodes = _spec(tmp_path, "c1")["devices"][0]["containerEdits"]["deviceNodes"]
    assert len(nodes) == count
    assert nodes[-1] == {
        "path": f"/dev/nvidia-caps-imex-channels/channel{count - 1}", "type": "c", "major": 237,
        "minor": count - 1, "fileMode": 0o666,
    }  # fmt: skip
    assert rest.get(NODE_PATH)["metadata"]["labels"] == {api.DOMAIN_LABEL: UID}


def test_under_nvidias_names_a_driver_managed_channel_and_daemon_prepare_and_unprepare_in_nvidias_names(
    tmp_path: Path,
) -> None:
    """--compat nvidia, driverManaged IMEX: the clique read is of resource.nvidia.com, the Node label NVIDIA's, the
    CDI kind k8s.compute-domain.nvidia.com; configs of NVIDIA's apiVersion are taken (ours refused), and unprepare
    takes the label off again."""
    names = api.NVIDIA
    rest = FakeRest()
    rest.put(NODE_PATH, {"metadata": {"name": NODE}})
    domain = {"metadata": {"name": "job", "namespace": "team", "uid": UID}, "spec": {}}
    rest.put(path_of(names.api_version, "computedomains", "team", "job"), domain)
    facts = NodeFacts(NODE, CLIQUE, 237, CharDevice("/dev/nvidia-caps/nvidia-cap1", 236, 1, 0o400))
    driver = ComputeDomainDriver(
        facts=facts,
        rest=rest,  # type: ignore[arg-type]
        namespace="dradriver",
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        names=names,
    )
    clique = path_of(names.api_version, "computedomaincliques", "dradriver", f"{UID}.{CLIQUE}")
    rest.put(clique, {"metadata": {"name": f"{UID}.{CLIQUE}"}, "daemons": [{"nodeName": NODE, "status": "Ready"}]})

    ours = driver.prepare_resource_claims([_claim("c0", "channel-0", api.channel_config(UID, "Single"))])["c0"]
    assert ours.error and "resource.nvidia.com/v1beta1" in ours.error
    claims = [
        _claim("c1", "channel-0", api.channel_config(UID, "Single", names)),
        _claim("d1", "daemon-0", api.daemon_config(UID, names), namespace="dradriver"),
    ]
    results = driver.prepare_resource_claims(claims)
    assert {uid: result.error for uid, result in results.items()} == {"c1": None, "d1": None}
    assert results["c1"].devices[0].cdi_device_ids == ("k8s.compute-domain.nvidia.com/claim=c1-channel-0",)
    spec = json.loads((tmp_path / "cdi" / "k8s.compute-domain.nvidia.com-claim_c1.json").read_text())
    assert spec["kind"] == "k8s.compute-domain.nvidia.com/claim"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia-caps-imex-channels/channel0"
    assert rest.get(NODE_PATH)["metadata"]["labels"] == {"resource.nvidia.com/computeDomain": UID}
    refs = [ClaimRef("team", "claim-c1", "c1"), ClaimRef("dradriver", "claim-d1", "d1")]
    assert driver.unprepare_resource_claims(refs) == {"c1": None, "d1": None}
    assert not rest.get(NODE_PATH)["metadata"].get("labels")
    assert not list((tmp_path / "cdi").glob("*.json"))


def test_a_channel_waits_for_the_daemon_then_asks_the_kubelet_to_retry(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest, "NotReady")
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"]
    assert result.error and "not Ready in clique" in result.error
    # The label is set anyway: it is what brings the daemon to this node.
    assert rest.get(NODE_PATH)["metadata"]["labels"] == {api.DOMAIN_LABEL: UID}
    _ready(rest)
    assert driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"].devices


def test_a_node_of_another_domain_is_refused(rest: FakeRest, tmp_path: Path) -> None:
    rest.merge_patch(NODE_PATH, {"metadata": {"labels": {api.DOMAIN_LABEL: "other-uid"}}})
    result = _driver(rest, tmp_path).prepare_resource_claims(
        [_claim("c1", "channel-0", api.channel_config(UID, "Single"))]
    )["c1"]
    assert result.error and "one domain per node" in result.error


def test_a_channel_claim_must_be_in_its_domains_namespace(rest: FakeRest, tmp_path: Path) -> None:
    claim = _claim("c1", "channel-0", api.channel_config(UID, "Single"), namespace="elsewhere")
    result = _driver(rest, tmp_path).prepare_resource_claims([claim])["c1"]
    assert result.error and "no ComputeDomain with UID cd-uid-1 in namespace elsewhere" in result.error
    assert "labels" not in rest.get(NODE_PATH)["metadata"]


def test_a_label_write_that_loses_a_race_is_retried(rest: FakeRest, tmp_path: Path) -> None:
    _ready(rest)
    rest.conflicts = 1
    result = _driver(rest, tmp_path).prepare_resource_claims(
        [_claim("c1", "channel-0", api.channel_config(UID, "Single"))]
    )["c1"]
    assert result.error is None


def test_channel_zero_waits_until_the_claim_holding_it_is_unprepared(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest)
    assert driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"].devices
    second = driver.prepare_resource_claims([_claim("c2", "channel-0", api.channel_config(UID, "Single"))])["c2"]
    assert second.error and "still held by claim c1" in second.error
    assert driver.unprepare_resource_claims([ClaimRef("team", "claim-c1", "c1")]) == {"c1": None}
    assert "labels" not in rest.get(NODE_PATH)["metadata"] or not rest.get(NODE_PATH)["metadata"]["labels"]
    assert not (tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_c1.json").exists()
    _ready(rest)
    assert driver.prepare_resource_claims([_claim("c2", "channel-0", api.channel_config(UID, "Single"))])["c2"].devices


def test_prepare_is_idempotent(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest)
    claim = _claim("c1", "channel-0", api.channel_config(UID, "Single"))
    first = driver.prepare_resource_claims([claim])["c1"]
    assert driver.prepare_resource_claims([claim])["c1"] == first


def test_a_node_outside_any_clique_gets_no_channel_device(rest: FakeRest, tmp_path: Path) -> None:
    result = _driver(rest, tmp_path, clique="").prepare_resource_claims(
        [_claim("c1", "channel-0", api.channel_config(UID, "Single"))]
    )["c1"]
    assert result.error is None
    assert "deviceNodes" not in _spec(tmp_path, "c1")["devices"][0]["containerEdits"]


def test_the_daemon_claim_gets_its_domain_files_env_and_management_device(rest: FakeRest, tmp_path: Path) -> None:
    claim = _claim("d1", "daemon-0", api.daemon_config(UID), namespace="dradriver")
    assert _driver(rest, tmp_path).prepare_resource_claims([claim])["d1"].error is None
    edits = _spec(tmp_path, "d1")["devices"][0]["containerEdits"]
    assert edits["env"] == [
        f"CLIQUE_ID={CLIQUE}", f"COMPUTE_DOMAIN_UUID={UID}", "COMPUTE_DOMAIN_NAME=job", "COMPUTE_DOMAIN_NAMESPACE=team"
    ]  # fmt: skip
    assert edits["mounts"][0]["containerPath"] == "/imexd"
    assert Path(edits["mounts"][0]["hostPath"]).is_dir()
    assert edits["deviceNodes"] == [
        {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "c", "major": 236, "minor": 1, "fileMode": 0o400}
    ]


@pytest.mark.parametrize(
    ("device", "parameters", "message"),
    [
        ("channel-0", api.daemon_config(UID), "no ComputeDomainChannelConfig"),
        ("daemon-0", api.channel_config(UID, "Single"), "no ComputeDomainDaemonConfig"),
        ("channel-0", {"apiVersion": api.API_VERSION, "kind": "GpuConfig"}, "is not one of"),
        ("channel-0", {**api.channel_config(UID, "Single"), "allocationMode": "Some"}, "allocationMode"),
        ("channel-0", {**api.channel_config(UID, "Single"), "domainID": ""}, "domainID"),
    ],
)
def test_wrong_configs_are_refused_naming_the_field(
    rest: FakeRest, tmp_path: Path, device: str, parameters: dict[str, Any], message: str
) -> None:
    result = _driver(rest, tmp_path).prepare_resource_claims([_claim("c1", device, parameters)])["c1"]
    assert result.error and message in result.error


def test_a_node_whose_fabric_is_not_registered_refuses_channels(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    driver.facts = NodeFacts(NODE, "", 0, None, problem="GPU x: NVLink fabric registration is IN_PROGRESS")
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"]
    assert result.error == (
        "node tray-a cannot serve ComputeDomains now: GPU x: NVLink fabric registration is IN_PROGRESS"
    )
    assert "labels" not in rest.get(NODE_PATH)["metadata"]


def test_the_daemon_claim_mounts_the_host_drivers_imex_binaries(rest: FakeRest, tmp_path: Path) -> None:
    mount = {"hostPath": "/run/nvidia/driver/usr/bin/nvidia-imex", "containerPath": "/usr/bin/nvidia-imex",
             "options": ["ro", "nosuid", "nodev", "bind"]}  # fmt: skip
    driver = _driver(rest, tmp_path)
    driver.daemon_mounts = [mount]
    claim = _claim("d1", "daemon-0", api.daemon_config(UID), namespace="dradriver")
    assert driver.prepare_resource_claims([claim])["d1"].error is None
    assert _spec(tmp_path, "d1")["devices"][0]["containerEdits"]["mounts"][1] == mount


def test_the_domains_files_go_with_its_daemon_claim(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    claim = _claim("d1", "daemon-0", api.daemon_config(UID), namespace="dradriver")
    assert driver.prepare_resource_claims([claim])["d1"].error is None
    assert (tmp_path / "state" / "domains" / UID).is_dir()
    assert driver.unprepare_resource_claims([claim.ref]) == {"d1": None}
    assert not (tmp_path / "state" / "domains" / UID).exists()
    assert not (tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_d1.json").exists()


def test_a_daemon_claim_outside_the_drivers_namespace_is_refused(rest: FakeRest, tmp_path: Path) -> None:
    claim = _claim("d1", "daemon-0", api.daemon_config(UID), namespace="team")
    result = _driver(rest, tmp_path).prepare_resource_claims([claim])["d1"]
    assert result.error and (
        "only the IMEX DaemonSet of a ComputeDomain (in the driver's namespace dradriver) may request daemon devices"
        in result.error
    )
    assert not (tmp_path / "state" / "domains" / UID).exists()
    assert not (tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_d1.json").exists()


def test_a_daemon_prepare_is_not_held_up_by_a_channel_prepare_waiting_for_that_daemon(
    rest: FakeRest, tmp_path: Path
) -> None:
    """Prepares share one node-wide lock (rolling updates): a channel prepare must not sit on it waiting for the
    daemon whose own prepare needs it. It looks once and hands the retry to the kubelet."""
    handler = SerializedHandler(_driver(rest, tmp_path), tmp_path / "serialize.lock")
    _ready(rest, "NotReady")
    channel: dict[str, PrepareResult] = {}
    started = time.monotonic()
    thread = threading.Thread(
        target=lambda: channel.update(
            handler.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])
        )
    )
    thread.start()
    daemon = handler.prepare_resource_claims([_claim("d1", "daemon-0", api.daemon_config(UID), namespace="dradriver")])
    thread.join(60)
    assert daemon["d1"].error is None
    assert channel["c1"].error and "not Ready in clique" in channel["c1"].error
    assert time.monotonic() - started < 5  # the old wait held the lock for --cd-ready-timeout (20 s)


@pytest.mark.parametrize("text", ["{not json", '{"claims": []}', '{"claims": {"c0": "channel"}}', "[]"])
def test_a_corrupt_checkpoint_is_an_error_naming_the_file_and_the_fix(
    rest: FakeRest, tmp_path: Path, text: str
) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest)
    driver.checkpoint.path.write_text(text)
    result = driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"]
    assert result.error and result.error.startswith(
        f"ComputeDomain checkpoint {tmp_path}/state/checkpoint.json is corrupt ("
    )
    assert result.error.endswith("move it aside and restart this node's dradriver pod; the kubelet then prepares the "
                                 "claims of running pods again")  # fmt: skip
    unprepared = driver.unprepare_resource_claims([ClaimRef("team", "claim-c1", "c1")])["c1"]
    assert unprepared and f"{tmp_path}/state/checkpoint.json is corrupt" in unprepared


def test_the_checkpoint_and_cdi_specs_leave_no_temp_files(rest: FakeRest, tmp_path: Path) -> None:
    driver = _driver(rest, tmp_path)
    _ready(rest)
    assert driver.prepare_resource_claims([_claim("c1", "channel-0", api.channel_config(UID, "Single"))])["c1"].devices
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["checkpoint.json"]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [f"{api.CDI_VENDOR}-claim_c1.json"]
