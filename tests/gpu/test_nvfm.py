"""``NvfmFabricManager``, the Fabric Manager client of a real node, against a stand-in libnvfm compiled from C with
FM's structure layouts and documented answers (tests/support/nvfm_standin.py): partitions read through the real
structures, one connection per call, FM's refusals named, counts past an array's bound refused; and the driver's
partition step on a simulated HGX board through this client instead of the simulator's Fabric Manager."""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.nvfm_standin import HGX_BUSES, FmStandin, build, fm_bus_id

from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.gpu import nvfm
from dradriver.gpu.fabric_manager import (
    UNKNOWN_PCI_BUS_ID,
    FabricManagerError,
    FabricManagerNotReady,
    check_partitions,
    normalize_pci_bus_id,
    partition_gpu,
)
from dradriver.gpu.inventory import MigMode, discover
from dradriver.gpu.nvfm import FabricManagerAddress, NvfmFabricManager
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from tests.driver.prepare.test_state_mig import DRIVER, claim, ref


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvfm-build"))


@pytest.fixture
def silent(built: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FmStandin]:
    """The stand-in with nothing at FM's socket (Fabric Manager not started)."""
    directory = Path(tempfile.mkdtemp(prefix="nvfm-", dir="/tmp"))  # short: a unix socket's path is limited
    try:
        yield FmStandin(directory, built, monkeypatch)
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def standin(built: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FmStandin]:
    """The stand-in with FM listening on its socket for the whole test."""
    directory = Path(tempfile.mkdtemp(prefix="nvfm-", dir="/tmp"))
    try:
        fm = FmStandin(directory, built, monkeypatch)
        with fm.listening():
            yield fm
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def client(standin: FmStandin) -> Iterator[NvfmFabricManager]:
    c = NvfmFabricManager(str(standin.library), address=FabricManagerAddress(str(standin.socket), True))
    yield c
    c.close()


def test_partitions_are_read_through_fm_s_structures_with_pci_addresses_as_nvml_s_adapter_spells_them(
    client: NvfmFabricManager,
) -> None:
    partitions = client.supported_partitions()
    check_partitions(partitions)
    assert [p.size for p in partitions] == [8, 4, 4, 2, 2, 2, 2, *[1] * 8]
    assert [p.id for p in partitions] == list(range(15))
    first = partitions[3]
    assert not first.active and first.describe() == "partition 3 (GPUs 1,2)"
    assert first.pci_bus_ids == {"0000:1b:00.0", "0000:43:00.0"}
    assert first.gpus[0].uuid == "GPU-00000001-0000-0000-0000-000000000000"


def test_every_call_opens_a_connection_of_its_own_and_closes_it(standin: FmStandin) -> None:
    c = NvfmFabricManager(
        str(standin.library), address=FabricManagerAddress(str(standin.socket), True), timeout_ms=2500
    )
    try:
        c.supported_partitions()
        c.activate(3)
        c.deactivate(3)
    finally:
        c.close()
    connect = f"fmConnect unix=1 type=2 address={standin.socket} timeout=2500"
    assert standin.calls() == [
        "fmLibInit",
        *(connect, "fmGetSupportedFabricPartitions", "fmDisconnect"),
        *(connect, "fmActivateFabricPartition 3", "fmDisconnect"),
        *(connect, "fmDeactivateFabricPartition 3", "fmDisconnect"),
        "fmLibShutdown",
    ]


def test_the_activation_is_the_fabric_s_and_outlives_the_client(standin: FmStandin, client: NvfmFabricManager) -> None:
    client.activate(3)
    client.activate(11)
    assert standin.active() == [3, 11]
    client.close()
    other = NvfmFabricManager(str(standin.library), address=FabricManagerAddress(str(standin.socket), True))
    try:
        assert [p.id for p in other.supported_partitions() if p.active] == [3, 11]
    finally:
        other.close()


@pytest.mark.parametrize(
    ("active", "call", "partition", "error"),
    [
        ([3], "activate", 3, r"fmActivateFabricPartition\(3\).*FM_ST_IN_USE: .*the partition already active"),
        # The stand-in's answer for a GPU in another active partition (FM's header names none; real FM may answer -24).
        ([3], "activate", 1, r"fmActivateFabricPartition\(1\).*FM_ST_IN_USE"),
        ([], "activate", 15, r"fmActivateFabricPartition\(15\).*FM_ST_BADPARAM: Fabric Manager supports no such"),
        ([], "deactivate", 4, r"fmDeactivateFabricPartition\(4\).*FM_ST_UNINITIALIZED: the partition is not active"),
    ],
    ids=["already-active", "a-gpu-in-an-active-partition", "unknown-partition", "not-active"],
)
def test_fm_s_refusals_name_the_call_the_partition_and_fm_s_code(
    client: NvfmFabricManager, standin: FmStandin, *, active: list[int], call: str, partition: int, error: str
) -> None:
    for p in active:
        client.activate(p)
    with pytest.raises(FabricManagerError, match=error) as caught:
        getattr(client, call)(partition)
    assert caught.value.code in (-1, -4, -7)
    assert standin.active() == active


def test_an_nvlink_failure_fm_reports_is_named(standin: FmStandin, client: NvfmFabricManager) -> None:
    standin.add("refuse 3 -10")
    with pytest.raises(
        FabricManagerError, match=r"fmActivateFabricPartition\(3\).*FM_ST_NVLINK_ERROR.*Fabric Manager's log"
    ):
        client.activate(3)
    assert standin.active() == []


def test_fm_outside_shared_nvswitch_mode_is_told_how_to_set_it(standin: FmStandin, client: NvfmFabricManager) -> None:
    standin.add("not-shared")
    with pytest.raises(FabricManagerError, match=r"FM_ST_NOT_SUPPORTED: .*shared-NVSwitch mode: set FABRIC_MODE=1"):
        client.supported_partitions()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("report-partitions 65", "reported 65 partitions in its list, but FM's structure holds at most 64"),
        ("report-gpus 0 17", "reported 17 GPUs in partition 0, but FM's structure holds at most 16"),
    ],
    ids=["partitions", "gpus"],
)
def test_a_count_past_its_array_s_bound_is_refused_not_clamped(
    standin: FmStandin, client: NvfmFabricManager, line: str, error: str
) -> None:
    standin.add(line)
    with pytest.raises(FabricManagerError, match=error):
        client.supported_partitions()


def test_a_missing_socket_says_what_to_start(silent: FmStandin) -> None:
    c = NvfmFabricManager(str(silent.library), address=FabricManagerAddress(str(silent.socket), True))
    try:
        with pytest.raises(FabricManagerError, match=r"no Fabric Manager socket at .*fm.sock: start Fabric Manager"):
            c.supported_partitions()
    finally:
        c.close()


def test_a_tcp_address_connects_as_fm_s_inet_type_and_an_unreachable_one_says_what_to_start(
    standin: FmStandin,
) -> None:
    standin.add("tcp 127.0.0.1:6666")
    for address, reachable in (("127.0.0.1", True), ("127.0.0.1:6666", True), ("127.0.0.1:7777", False)):
        c = NvfmFabricManager(str(standin.library), address=FabricManagerAddress.parse(address))
        try:
            if reachable:
                assert len(c.supported_partitions()) == 15
            else:
                with pytest.raises(FabricManagerError, match=r"fmConnect at 127.0.0.1:7777 \(TCP\): "
                                   r"FM_ST_CONNECTION_NOT_VALID: .*systemctl start nvidia-fabricmanager"):  # fmt: skip
                    c.supported_partitions()
        finally:
            c.close()
    assert "fmConnect unix=0 type=1 address=127.0.0.1 timeout=1000" in standin.calls()


def test_a_file_that_is_not_fm_s_library_is_refused_by_name(tmp_path: Path) -> None:
    address = FabricManagerAddress("/run/nvidia-fabricmanager/socket", True)
    with pytest.raises(FabricManagerError, match=r"cannot load Fabric Manager's client library .*nowhere"):
        NvfmFabricManager(str(tmp_path / "nowhere/libnvfm.so.1"), address=address)
    with pytest.raises(FabricManagerError, match=r"libc\.so\.6 has no fmLibInit: it is not Fabric Manager's client"):
        NvfmFabricManager("libc.so.6", address=address)


def test_the_structures_have_the_sizes_and_version_words_of_fm_s_headers() -> None:
    # Printed by a C program compiled against nv_fm_agent.h / nv_fm_types.h (go-nvfm's copy, b587f11880ea):
    # fmConnectParams_version, fmFabricPartitionList_version, sizeof(fmFabricPartitionGpuInfo_t), and of
    # fmFabricPartitionInfo_t.
    assert (nvfm.CONNECT_PARAMS_VERSION, nvfm.PARTITION_LIST_VERSION) == (33554704, 16909068)
    assert (ctypes.sizeof(nvfm._PartitionGpuInfo), ctypes.sizeof(nvfm._PartitionInfo)) == (128, 2060)


def test_the_structures_fields_lie_at_the_offsets_of_fm_s_headers() -> None:
    # offsetof() of each field after an array or a padding candidate, measured against nv_fm_types.h (go-nvfm's
    # copy, b587f11880ea): a field out of place would still give the right sizes above.
    def offsets(struct: type[ctypes.Structure], *names: str) -> list[int]:
        return [getattr(struct, name).offset for name in names]

    assert offsets(nvfm._ConnectParams, "timeoutMs", "addressIsUnixSocket", "addressType") == [260, 264, 268]
    assert offsets(nvfm._PartitionGpuInfo, "uuid", "pciBusId", "numNvLinksAvailable") == [4, 84, 116]
    assert offsets(nvfm._PartitionInfo, "isActive", "numGpus", "gpuInfo") == [4, 8, 12]
    assert offsets(nvfm._PartitionList, "numPartitions", "partitionInfo") == [4, 12]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("/run/nvidia-fabricmanager/socket", FabricManagerAddress("/run/nvidia-fabricmanager/socket", True)),
        ("127.0.0.1", FabricManagerAddress("127.0.0.1", False)),
        ("10.0.0.5:6666", FabricManagerAddress("10.0.0.5:6666", False)),
        ("run/socket", None),
        ("127.0.0.1:http", None),
        ("127.0.0.1:70000", None),
        # FM's header: addressInfo is <ipv4>:<port_number> for a TCP address; no host names, no empty port.
        ("localhost:6666", None),
        ("300.0.0.1", None),
        ("127.0.0.1:", None),
        ("127.0.0.1:6666:1", None),
    ],
)
def test_an_address_is_a_socket_s_absolute_path_or_ipv4_and_port(
    text: str, parsed: FabricManagerAddress | None
) -> None:
    if parsed is None:
        with pytest.raises(FabricManagerError, match="neither a unix socket's absolute path nor"):
            FabricManagerAddress.parse(text)
    else:
        assert FabricManagerAddress.parse(text) == parsed


@pytest.mark.parametrize(
    ("fm_spelling", "ours"),
    [("00000000:1B:00.0", "0000:1b:00.0"), ("0000:df:00.0", "0000:df:00.0"), ("9D:00.0", "0000:9d:00.0")],
)
def test_fm_s_pci_addresses_are_spelled_as_nvml_s_adapter_spells_them(fm_spelling: str, ours: str) -> None:
    assert normalize_pci_bus_id(fm_spelling) == ours


# --- the driver's partition step on this client ------------------------------------------------------------------

GPUS = [f"gpu-0000-{bus.lower()}-00-0" for bus in HGX_BUSES]


def test_prepare_on_a_simulated_hgx_board_activates_the_partition_through_the_client(
    standin: FmStandin, client: NvfmFabricManager, tmp_path: Path
) -> None:
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
    gpulib = simulated_gpulib_on(sim)
    store = CheckpointStore.open(tmp_path / "state", boot_id="boot-1")
    try:
        driver = GpuDriver(
            GpuDriverOptions(
                driver_name=DRIVER, pool="node-a", mig_mode=MigMode.NONE, features=NodeFeatures(fabric_manager=client)
            ),
            inventory=discover(gpulib),
            cdi=CdiWriter(tmp_path / "cdi"),
            gpulib=gpulib,
            checkpoint=store,
        )
        attributes = driver.partition_attributes()
        assert attributes["0000:9d:00.0"]["gpuModuleID"] == {"int": 5}
        assert driver.prepare_resource_claims([claim("pair", GPUS[4], GPUS[5])])["pair"].error is None
        assert standin.active() == [5]
        odd = driver.prepare_resource_claims([claim("odd", GPUS[0], GPUS[2])])["odd"].error
        assert odd is not None and "form no Fabric Manager partition" in odd
        assert driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}
        assert standin.active() == []
    finally:
        store.close()


# --- review fixes: FM starting, the library's session, GPUs FM reports without a PCI address ------------------------


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (-8, r"FM_ST_NOT_CONFIGURED: Fabric Manager is still initialising and has no data yet; a start waits for it"),
        (-22, r"FM_ST_NOT_READY: Fabric Manager is not ready to serve API requests yet; a start waits for it"),
    ],
    ids=["not-configured", "not-ready"],
)
def test_fm_still_starting_is_not_ready_and_answers_once_it_is(
    standin: FmStandin, client: NvfmFabricManager, code: int, error: str
) -> None:
    standin.add(f"not-ready 1 {code}")
    with pytest.raises(FabricManagerNotReady, match=error) as caught:
        client.supported_partitions()
    assert caught.value.code == code
    assert len(client.supported_partitions()) == 15  # the stand-in's FM is ready from its second answer


def test_a_missing_socket_and_an_unreachable_fm_are_not_ready_but_a_refusal_is_final(
    silent: FmStandin, standin: FmStandin
) -> None:
    # FM starts beside the driver, often after this pod: what it answers before then is waited for at start.
    c = NvfmFabricManager(str(silent.library), address=FabricManagerAddress(str(silent.socket), True))
    try:
        with pytest.raises(FabricManagerNotReady, match="no Fabric Manager socket"):
            c.supported_partitions()
    finally:
        c.close()
    tcp = NvfmFabricManager(str(standin.library), address=FabricManagerAddress.parse("127.0.0.1:7777"))
    try:
        with pytest.raises(FabricManagerNotReady, match="FM_ST_CONNECTION_NOT_VALID"):
            tcp.supported_partitions()
        standin.add("not-shared")
        tcp.address = FabricManagerAddress(str(standin.socket), True)
        with pytest.raises(FabricManagerError, match="FM_ST_NOT_SUPPORTED") as final:
            tcp.supported_partitions()
        assert not isinstance(final.value, FabricManagerNotReady)
    finally:
        tcp.close()


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (-24, r"FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION: one of the partition's GPUs is already in another partition"),
        (-12, r"FM_ST_RESOURCE_IN_USE: one of the resources the call names is already in use"),
    ],
    ids=["used-in-another-partition", "resource-in-use"],
)
def test_fm_s_other_in_use_answers_say_what_they_mean(
    standin: FmStandin, client: NvfmFabricManager, code: int, error: str
) -> None:
    standin.add(f"refuse 3 {code}")
    with pytest.raises(FabricManagerError, match=rf"fmActivateFabricPartition\(3\): {error}"):
        client.activate(3)


def test_a_library_reached_through_a_symlink_is_the_same_library_initialised_once(standin: FmStandin) -> None:
    link = standin.library.parent / "libnvfm.so"
    link.symlink_to(standin.library.name)
    address = FabricManagerAddress(str(standin.socket), True)
    first = NvfmFabricManager(str(standin.library), address=address)
    second = NvfmFabricManager(str(link), address=address)  # without the real path as key: FM_ST_IN_USE
    assert nvfm._Library.users(str(link)) == 2
    first.close()
    second.close()
    assert nvfm._Library.users(str(standin.library)) == 0
    assert standin.calls() == ["fmLibInit", "fmLibShutdown"]


def test_a_failed_shutdown_leaves_the_library_initialised_for_the_next_client(
    standin: FmStandin, caplog: pytest.LogCaptureFixture
) -> None:
    standin.add("fail-shutdown 1")
    address = FabricManagerAddress(str(standin.socket), True)
    NvfmFabricManager(str(standin.library), address=address).close()
    assert "fmLibShutdown failed" in caplog.text and "FM_ST_GENERIC_ERROR" in caplog.text
    again = NvfmFabricManager(str(standin.library), address=address)  # not initialised twice: no FM_ST_IN_USE
    assert len(again.supported_partitions()) == 15
    again.close()
    assert [c for c in standin.calls() if c.startswith("fmLib")] == ["fmLibInit", "fmLibShutdown", "fmLibShutdown"]
    assert nvfm._Library.users(str(standin.library)) == 0


@pytest.mark.parametrize("reported", ["", "\udcff\udcfe", "not-a-pci-address"], ids=["empty", "not-utf-8", "garbage"])
def test_a_gpu_fm_reports_without_a_parsable_pci_address_is_listed_but_refused_for_matching(
    standin: FmStandin, client: NvfmFabricManager, caplog: pytest.LogCaptureFixture, reported: str
) -> None:
    reported_at(standin, "9D", reported)
    partitions = client.supported_partitions()
    assert len(partitions) == 15
    pair = partitions[5]
    assert pair.module_ids == {5, 6} and pair.gpus[0].pci_bus_id == UNKNOWN_PCI_BUS_ID
    assert "without a parsable PCI address partition=0 module=5" in caplog.text
    with pytest.raises(FabricManagerError, match="GPU module 5 of partition 0 without a PCI address it could parse"):
        check_partitions(partitions)
    with pytest.raises(FabricManagerError, match="module 5 without a PCI address it could parse"):
        partition_gpu(partitions, pci_bus_id="0000:9d:00.0", module_id=5)


def reported_at(standin: FmStandin, bus: str, reported: str) -> None:
    """FM's table with the GPU at ``bus`` reported at ``reported`` (surrogate escapes: bytes that are not UTF-8)."""
    lines = [line.replace(f",{fm_bus_id(bus)},", f",{reported},") for line in standin.table.read_text().splitlines()]
    standin.table.write_bytes("".join(f"{line}\n" for line in lines).encode(errors="surrogateescape"))


@pytest.fixture
def hgx_driver(standin: FmStandin, client: NvfmFabricManager, tmp_path: Path) -> Iterator[GpuDriver]:
    """The driver on a simulated HGX board whose partitions go through the client to the stand-in."""
    gpulib = simulated_gpulib_on(SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a"))
    store = CheckpointStore.open(tmp_path / "state", boot_id="boot-1")
    try:
        yield GpuDriver(
            GpuDriverOptions(
                driver_name=DRIVER, pool="node-a", mig_mode=MigMode.NONE, features=NodeFeatures(fabric_manager=client)
            ),
            inventory=discover(gpulib),
            cdi=CdiWriter(tmp_path / "cdi"),
            gpulib=gpulib,
            checkpoint=store,
        )
    finally:
        store.close()


def test_unprepare_of_a_partition_fm_no_longer_lists_succeeds_with_a_warning(
    standin: FmStandin, hgx_driver: GpuDriver, caplog: pytest.LogCaptureFixture
) -> None:
    # FM's list "can be fewer than the max due to hardware availability": NVIDIA's driver reads a partition it no
    # longer lists as not active. Unprepare must not fail forever over it.
    assert hgx_driver.prepare_resource_claims([claim("pair", GPUS[4], GPUS[5])])["pair"].error is None
    standin.write([line for line in standin.table.read_text().splitlines() if not line.startswith("partition 5 ")])
    assert hgx_driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "no longer lists" in r.getMessage()]
    assert len(warnings) == 1 and "partition=5" in warnings[0].getMessage()
    assert "fmDeactivateFabricPartition 5" not in standin.calls()
    # Activating one FM does not list is still refused.
    refused = hgx_driver.prepare_resource_claims([claim("again", GPUS[4], GPUS[5])])["again"].error
    assert refused is not None and "no longer reports partition 5" in refused


def test_a_gpu_fm_reports_without_a_pci_address_later_still_counts_by_module_and_its_partition_is_undone(
    standin: FmStandin, hgx_driver: GpuDriver
) -> None:
    assert hgx_driver.prepare_resource_claims([claim("pair", GPUS[4], GPUS[5])])["pair"].error is None
    reported_at(standin, "9D", "")  # FM now reports module 5 without an address
    # GPU 5 alone overlaps the active partition 5 only through the GPU FM reports without an address: found by
    # module id, before anything changes.
    overlap = hgx_driver.prepare_resource_claims([claim("one", GPUS[4])])["one"].error
    assert overlap is not None and "partition 5 (GPUs 5,6) is active" in overlap
    assert hgx_driver.unprepare_resource_claims([ref("pair")]) == {"pair": None}
    assert standin.active() == []
