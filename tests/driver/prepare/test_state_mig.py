"""Dynamic MIG at prepare: carving, unprepare, rollback, idempotence and overlap, on a simulated node."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver import faults
from dradriver.driver.prepare import transaction
from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimState
from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef
from dradriver.sim import mps_standin
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import INSUFFICIENT_RESOURCES, SimulatedNode
from dradriver.sim.profiles import load_node_profile

DRIVER = "gpu.dradriver.dev"
H100 = "gpu-0000-1b-00-0"  # first GPU of hgx-h100-80gb (Hopper: MIG mode switches without a reset)
A100 = "gpu-0000-07-00-0"  # first GPU of dgx-a100-40gb (Ampere: MIG mode switches with a reset)


def claim(uid: str, *devices: str, admin: bool = False) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef("default", f"claim-{uid}", uid),
        devices=tuple(
            AllocatedDevice(request=f"r{i}", pool="node-a", device=d, admin_access=admin) for i, d in enumerate(devices)
        ),
    )


def ref(uid: str) -> ClaimRef:
    return ClaimRef("default", f"claim-{uid}", uid)


class Node:
    """A simulated node with a driver on it; ``restart()`` builds a new driver on the same hardware and files."""

    def __init__(self, tmp_path: Path, profile: str, mig_mode: MigMode = MigMode.DYNAMIC, *, mps: bool = False) -> None:
        self.tmp_path = tmp_path
        self.mps_root = tmp_path / "mps" if mps else None  # MPS daemons: the simulated node's stand-in
        self.sim = SimulatedNode(load_node_profile(profile), node_name="node-a")
        self.mig_mode = mig_mode
        self.cdi_dir = tmp_path / "cdi"
        self.state_dir = tmp_path / "state"
        self.store: CheckpointStore | None = None
        self.driver = self.restart()

    def restart(self, boot_id: str = "boot-1") -> GpuDriver:
        if self.store is not None:
            self.store.close()
        gpulib = simulated_gpulib_on(self.sim)
        self.store = CheckpointStore.open(self.state_dir, boot_id=boot_id)
        self.driver = GpuDriver(
            GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=self.mig_mode),
            inventory=discover(gpulib),
            cdi=CdiWriter(self.cdi_dir),
            gpulib=gpulib,
            checkpoint=self.store,
            mps=MpsControl(mps_standin.command(), self.mps_root) if self.mps_root is not None else None,
        )
        return self.driver

    def prepare(self, c: AllocatedClaim) -> tuple[list[str], str | None]:
        result = self.driver.prepare_resource_claims([c])[c.uid]
        return [i for d in result.devices for i in d.cdi_device_ids], result.error

    def instances(self, gpu: int = 0) -> list[tuple[int, int, int]]:
        """(profile id, start, compute instances) of each GPU instance on GPU ``gpu``."""
        return sorted(
            (gi.profile.id, gi.placement.start, len(gi.compute_instances))
            for gi in self.sim.gpus[gpu].gpu_instances.values()
        )

    def spec(self, uid: str) -> dict:
        return json.loads((self.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{uid}.json").read_text())

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json")) if self.cdi_dir.exists() else []

    def assert_clean(self, mig_current: bool | None = None) -> None:
        """Nothing of any claim is left: no instance, no CDI spec, no checkpoint record."""
        assert self.instances() == []
        assert self.cdi_files() == []
        assert self.driver.checkpoint.records() == []
        if mig_current is not None:
            assert self.sim.gpus[0].mig_current is mig_current


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "hgx-h100-80gb")
    yield node
    assert node.store is not None
    node.store.close()


@pytest.fixture
def a100(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "dgx-a100-40gb")
    yield node
    assert node.store is not None
    node.store.close()


def test_one_partition_is_carved_and_its_mig_device_handed_to_the_container(h100: Node):
    ids, error = h100.prepare(claim("u1", f"{H100}-mig-3g40gb-4"))
    assert error is None
    assert ids == [f"k8s.gpu.dradriver.dev/claim=u1-{H100}-mig-3g40gb-4"]
    assert h100.sim.gpus[0].mig_current
    assert h100.instances() == [(9, 4, 1)]
    mig_uuid = next(iter(next(iter(h100.sim.gpus[0].gpu_instances.values())).compute_instances.values())).uuid
    spec = h100.spec("u1")
    assert f"DRADRIVER_DEVICE_GPU_0000_1B_00_0_MIG_3G40GB_4={mig_uuid}" in spec["devices"][0]["containerEdits"]["env"]
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0" and len(nodes) == 3
    assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in nodes[1:])
    [record] = h100.driver.checkpoint.records()
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert record.devices[0].mig_uuid == mig_uuid and record.devices[0].previous_mig_mode is False
    assert record.devices[0].gpu_instance_id is not None and record.devices[0].compute_instance_id == 0


def test_unprepare_destroys_what_the_claim_created_and_leaves_mig_mode_on(h100: Node):
    h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0", f"{H100}-mig-2g20gb-2"))
    assert h100.driver.unprepare_resource_claims([ref("u1")]) == {"u1": None}
    h100.assert_clean(mig_current=True)
    assert h100.driver.unprepare_resource_claims([ref("u1")]) == {"u1": None}  # idempotent


def test_several_partitions_of_one_claim_on_one_gpu(h100: Node):
    ids, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0", f"{H100}-mig-1g10gb-1", f"{H100}-mig-3g40gb-4"))
    assert error is None and len(ids) == 3
    assert h100.instances() == [(9, 4, 1), (19, 0, 1), (19, 1, 1)]
    uuids = [e.split("=", 1)[1] for d in h100.spec("u1")["devices"] for e in d["containerEdits"]["env"]]
    assert len(uuids) == 3 and all(u.startswith("MIG-") for u in uuids)


def test_two_claims_on_one_gpu_are_carved_and_released_independently(h100: Node):
    assert h100.prepare(claim("a", f"{H100}-mig-3g40gb-0"))[1] is None
    assert h100.prepare(claim("b", f"{H100}-mig-3g40gb-4"))[1] is None
    assert h100.instances() == [(9, 0, 1), (9, 4, 1)]
    h100.driver.unprepare_resource_claims([ref("a")])
    assert h100.instances() == [(9, 4, 1)]  # b's instance is untouched
    assert h100.cdi_files() == ["k8s.gpu.dradriver.dev-claim_b.json"]


def test_the_whole_gpu_after_its_partitions_are_released_leaves_mig_mode(h100: Node):
    h100.prepare(claim("a", f"{H100}-mig-7g80gb-0"))
    h100.driver.unprepare_resource_claims([ref("a")])
    assert h100.sim.gpus[0].mig_current
    ids, error = h100.prepare(claim("w", H100))
    assert error is None and ids == [f"k8s.gpu.dradriver.dev/claim=w-{H100}"]
    assert not h100.sim.gpus[0].mig_current
    assert h100.spec("w")["devices"][0]["containerEdits"]["env"] == [
        f"DRADRIVER_DEVICE_GPU_0000_1B_00_0={h100.sim.gpus[0].uuid}"
    ]
    [record] = h100.driver.checkpoint.records()
    assert record.devices[0].previous_mig_mode is True


def test_a_partition_overlapping_another_claims_partition_or_whole_gpu_is_refused(h100: Node):
    assert h100.prepare(claim("a", f"{H100}-mig-3g40gb-0"))[1] is None
    _, error = h100.prepare(claim("b", f"{H100}-mig-1g10gb-2"))
    assert error is not None
    assert f"{H100}-mig-1g10gb-2 overlaps {H100}-mig-3g40gb-0" in error and "claim a (default/claim-a)" in error
    _, error = h100.prepare(claim("c", H100))
    assert error is not None and "overlaps" in error and "claim a" in error
    assert h100.instances() == [(9, 0, 1)]
    assert [r.uid for r in h100.driver.checkpoint.records()] == ["a"]
    # The other way round: partitions of a GPU prepared whole are refused too.
    h100.driver.unprepare_resource_claims([ref("a")])
    assert h100.prepare(claim("w", H100))[1] is None
    _, error = h100.prepare(claim("d", f"{H100}-mig-1g10gb-6"))
    assert error is not None and "claim w (default/claim-w)" in error


def test_a_placement_taken_behind_the_drivers_back_fails_clearly_and_nothing_leaks(h100: Node):
    h100.sim.set_mig_mode(0, True)
    foreign = h100.sim.create_gpu_instance(0, 9, 4)  # an admin's 3g.40gb at slice 4, unknown to the driver
    _, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0", f"{H100}-mig-1g10gb-5"))
    assert error is not None
    assert f"device {H100}-mig-1g10gb-5, step gpu-instance" in error
    assert "Insufficient Resources" in error and "everything done for the claim was undone" in error
    assert [(gi.id, gi.placement.start) for gi in h100.sim.gpus[0].gpu_instances.values()] == [(foreign.id, 4)]
    assert h100.cdi_files() == [] and h100.driver.checkpoint.records() == []


@pytest.mark.parametrize(
    ("call", "step"),
    [
        ("nvmlDeviceSetMigMode", "mig-mode"),
        ("nvmlDeviceCreateGpuInstanceWithPlacement", "gpu-instance"),
        ("nvmlGpuInstanceGetInfo", "gpu-instance"),  # fails after the instance was created
        ("nvmlGpuInstanceCreateComputeInstance", "compute-instance"),
        ("nvmlComputeInstanceGetInfo_v2", "compute-instance"),  # fails after the compute instance was created
        ("nvmlDeviceGetUUID", None),  # reading back the MIG device
    ],
)
def test_an_nvml_failure_at_any_step_rolls_back_everything(h100: Node, call: str, step: str | None):
    # The second partition fails, so the first one (and MIG mode) must be undone as well.
    first = claim("ok", f"{H100}-mig-1g10gb-0")
    assert h100.prepare(first)[1] is None
    h100.driver.unprepare_resource_claims([first.ref])
    h100.sim.set_mig_mode(0, False)
    h100.driver.prepare_resource_claims([claim("warm", f"{H100}-mig-1g10gb-6")])  # NVML caches warmed
    h100.driver.unprepare_resource_claims([ref("warm")])
    h100.sim.set_mig_mode(0, False)
    h100.sim.inject_fault(call, INSUFFICIENT_RESOURCES if "Create" in call else 999)
    _, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))
    assert error is not None and "everything done for the claim was undone" in error
    if step is not None:
        assert f"step {step}" in error and f"{H100}" in error
    h100.assert_clean(mig_current=False)
    h100.sim.clear_faults()
    assert h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))[1] is None  # the retry succeeds


def test_a_failure_writing_the_cdi_spec_rolls_back_the_carving(h100: Node):
    h100.cdi_dir.write_text("not a directory")
    _, error = h100.prepare(claim("u1", f"{H100}-mig-2g20gb-0"))
    assert error is not None and "step cdi-spec" in error
    assert h100.instances() == [] and h100.driver.checkpoint.records() == []
    assert not h100.sim.gpus[0].mig_current


def test_a_failed_rollback_is_recorded_and_finished_by_the_next_prepare(h100: Node):
    h100.sim.inject_fault("nvmlGpuInstanceCreateComputeInstance", INSUFFICIENT_RESOURCES)
    h100.sim.inject_fault("nvmlGpuInstanceDestroy", 999)
    _, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-3"))
    assert error is not None and "undoing it failed too" in error
    [record] = h100.driver.checkpoint.records()
    assert record.state is ClaimState.PREPARE_STARTED and "gpu-instance" in (record.rollback_error or "")
    assert h100.instances() == [(19, 3, 0)]
    _ids, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-3"))
    assert error is None and h100.instances() == [(19, 3, 1)]


def test_repeated_prepare_and_unprepare(h100: Node):
    for _ in range(5):
        first = h100.prepare(claim("u1", f"{H100}-mig-1g20gb-2"))
        again = h100.prepare(claim("u1", f"{H100}-mig-1g20gb-2"))
        assert first == again and first[1] is None
        assert h100.instances() == [(15, 2, 1)]  # the second prepare touched no hardware
        assert h100.driver.unprepare_resource_claims([ref("u1")]) == {"u1": None}
        h100.assert_clean()


def test_prepare_after_a_restart_returns_the_recorded_ids_without_touching_the_hardware(h100: Node):
    ids, _ = h100.prepare(claim("u1", f"{H100}-mig-4g40gb-0"))
    spec = h100.spec("u1")
    h100.restart()
    h100.sim.inject_fault("nvmlDeviceCreateGpuInstanceWithPlacement", INSUFFICIENT_RESOURCES)
    assert h100.prepare(claim("u1", f"{H100}-mig-4g40gb-0")) == (ids, None)
    assert h100.spec("u1") == spec and h100.instances() == [(5, 0, 1)]


def test_ampere_switches_mig_mode_with_a_reset_when_nothing_uses_the_gpu(a100: Node):
    assert not a100.sim.gpus[0].mig_current
    _ids, error = a100.prepare(claim("p", f"{A100}-mig-3g20gb-0"))
    assert error is None and a100.sim.gpus[0].mig_current and a100.instances() == [(9, 0, 1)]
    a100.driver.unprepare_resource_claims([ref("p")])
    assert a100.prepare(claim("w", A100))[1] is None
    assert not a100.sim.gpus[0].mig_current and not a100.sim.gpus[0].mig_pending


def test_ampere_refuses_a_reset_while_another_claim_uses_the_gpu(a100: Node):
    assert a100.prepare(claim("monitor", A100, admin=True))[1] is None
    _, error = a100.prepare(claim("p", f"{A100}-mig-1g5gb-0"))
    assert error is not None and "needs a GPU reset" in error and "default/claim-monitor" in error
    assert not a100.sim.gpus[0].mig_current and a100.instances() == []


def test_static_mode_never_carves(tmp_path: Path):
    node = Node(tmp_path, "mixed", MigMode.STATIC)
    _, error = node.prepare(claim("u1", "gpu-0000-07-00-0-mig-1g5gb-5"))
    assert error is not None and "not offered by this node" in error  # static mode offers only what exists
    assert node.prepare(claim("u2", "gpu-0000-07-00-0-mig-3g20gb-0"))[1] is None
    assert len(node.sim.gpus[0].gpu_instances) == 3
    node.driver.unprepare_resource_claims([ref("u2")])
    assert len(node.sim.gpus[0].gpu_instances) == 3  # the admin's instance stays


# --- start-up reconciliation ----------------------------------------------------------------------------------


def test_reconcile_finishes_a_rollback_that_failed_before_the_restart(h100: Node):
    h100.sim.inject_fault("nvmlGpuInstanceCreateComputeInstance", INSUFFICIENT_RESOURCES)
    h100.sim.inject_fault("nvmlGpuInstanceDestroy", 999)
    h100.prepare(claim("u1", f"{H100}-mig-1g10gb-3"))
    assert h100.instances() == [(19, 3, 0)]
    h100.restart().reconcile()
    h100.assert_clean(mig_current=False)


def test_reconcile_unprepares_claims_the_api_server_no_longer_has(h100: Node):
    h100.prepare(claim("gone", f"{H100}-mig-3g40gb-0"))
    h100.prepare(claim("kept", f"{H100}-mig-3g40gb-4"))
    h100.prepare(claim("unknown", H100.replace("1b", "43")))
    asked: list[str] = []

    def exists(ref: ClaimRef) -> bool | None:
        asked.append(ref.uid)
        return {"gone": False, "kept": True}.get(ref.uid)  # None: the API server cannot tell now

    h100.restart().reconcile(exists)
    assert sorted(asked) == ["gone", "kept", "unknown"]
    assert sorted(r.uid for r in h100.driver.checkpoint.records()) == ["kept", "unknown"]
    assert h100.instances() == [(9, 4, 1)]
    assert "k8s.gpu.dradriver.dev-claim_gone.json" not in h100.cdi_files()


def test_reconcile_destroys_instances_no_claim_owns_in_dynamic_mode_only(h100: Node, tmp_path: Path):
    h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))
    orphan = h100.sim.create_gpu_instance(0, 19, 6)
    h100.sim.create_compute_instance(0, orphan.id, 0)
    (h100.cdi_dir / "k8s.gpu.dradriver.dev-claim_stray.json").write_text("{}")
    h100.restart().reconcile()
    assert h100.instances() == [(19, 0, 1)]
    assert h100.cdi_files() == ["k8s.gpu.dradriver.dev-claim_u1.json"]

    static = Node(tmp_path / "static", "mixed", MigMode.STATIC)
    before = static.instances()
    static.driver.reconcile()
    assert static.instances() == before and len(before) == 3  # the admin's instances stay


def test_a_new_boot_discards_the_checkpoint_and_its_leftovers(h100: Node):
    h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))
    h100.restart(boot_id="boot-2").reconcile()
    h100.assert_clean()


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the crash point runs, and the driver's memory is thrown away."""


@pytest.mark.parametrize(
    "point",
    [
        "prepare-started",
        "before:mig-mode",
        "after:mig-mode",
        "before:gpu-instance",
        "after:gpu-instance",
        "before:compute-instance",
        "after:compute-instance",
        "before:cdi-spec",
        "after:cdi-spec",
    ],
)
def test_a_crash_at_any_point_of_prepare_is_undone_at_start_up(h100: Node, monkeypatch: pytest.MonkeyPatch, point: str):
    def crash() -> None:
        raise Crash(point)

    monkeypatch.setattr(faults, "die", crash)
    monkeypatch.setenv(transaction.CRASH_ENV, point)
    with pytest.raises(Crash):
        h100.driver.prepare(claim("u1", f"{H100}-mig-3g40gb-4"))
    monkeypatch.delenv(transaction.CRASH_ENV)
    h100.restart().reconcile()
    h100.assert_clean(mig_current=False)
    ids, error = h100.prepare(claim("u1", f"{H100}-mig-3g40gb-4"))
    assert error is None and ids == [f"k8s.gpu.dradriver.dev/claim=u1-{H100}-mig-3g40gb-4"]


def test_claims_on_different_gpus_carve_in_parallel(h100: Node):
    import threading

    entered, release = threading.Event(), threading.Event()
    gpulib = h100.driver.gpulib
    assert gpulib is not None
    real_create = gpulib.create_gpu_instance

    def slow_on_first_gpu(gpu_uuid: str, profile_id: int, start: int):
        if gpu_uuid == h100.sim.gpus[0].uuid:
            entered.set()
            assert release.wait(10)
        return real_create(gpu_uuid, profile_id, start)

    gpulib.create_gpu_instance = slow_on_first_gpu  # type: ignore[method-assign]
    first = threading.Thread(target=h100.prepare, args=(claim("a", f"{H100}-mig-1g10gb-0"),))
    first.start()
    assert entered.wait(10)
    # GPU 0 is busy mid-carve; a claim on GPU 1 does not wait for it.
    assert h100.prepare(claim("b", "gpu-0000-43-00-0-mig-1g10gb-0"))[1] is None
    release.set()
    first.join(10)
    assert sorted(r.uid for r in h100.driver.checkpoint.records()) == ["a", "b"]


def test_start_up_removes_temp_files_a_crash_left_mid_write(h100: Node):
    h100.cdi_dir.mkdir()
    (h100.cdi_dir / ".k8s.gpu.dradriver.dev-claim_u1.abc.tmp").write_text("{")
    (h100.cdi_dir / ".other-vendor_x.tmp").write_text("{")  # not ours: left alone
    (h100.state_dir / ".checkpoint.json.abc.tmp").write_text("{")
    h100.restart().reconcile()
    assert sorted(p.name for p in h100.cdi_dir.iterdir()) == [".other-vendor_x.tmp"]
    assert not list(h100.state_dir.glob("*.tmp"))


@pytest.mark.parametrize(("failing_write", "what"), [(1, "PrepareStarted"), (2, "CDI spec"), (3, "PrepareCompleted")])
def test_a_full_disk_at_any_write_fails_the_claim_and_half_writes_nothing(
    h100: Node, monkeypatch: pytest.MonkeyPatch, failing_write: int, what: str
):
    """ENOSPC through the fsync seam at one of a MIG prepare's three writes: a per-claim error, nothing carved
    or written is left (in memory, on disk or on the hardware), and once space is back the prepare succeeds."""
    real_fsync, data_writes = os.fsync, [0]

    def full_disk(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):  # a data write, not a directory's fsync
            data_writes[0] += 1
            if data_writes[0] == failing_write:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    h100.sim.set_mig_mode(0, True)  # so the writes are PrepareStarted, the CDI spec and PrepareCompleted
    monkeypatch.setattr(os, "fsync", full_disk)
    _, error = h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert error is not None and "No space left on device" in error, what
    assert h100.instances() == [] and h100.cdi_files() == [], what
    assert not list(h100.state_dir.glob(".*.tmp")) and not list(h100.cdi_dir.glob(".*.tmp")), what
    h100.restart().reconcile()  # what the file says agrees with the hardware
    h100.assert_clean()
    assert h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))[1] is None


class StorageFault:
    """Makes one directory full (ENOSPC at the fsync of a file written there) or read-only (EROFS when a file is
    created or removed there), raising the real OSError at the real call: the suite runs as root, where chmod
    does not stop a write, and cannot mount a read-only or full filesystem."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path, kind: str) -> None:
        self.directory, self.kind = directory, kind
        self._monkeypatch = monkeypatch
        real_fsync, real_open, real_unlink = os.fsync, os.open, os.unlink

        def fsync(fd: int) -> None:
            if kind == "full" and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == directory:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        def open_(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
            if kind == "read-only" and flags & os.O_CREAT and Path(path).parent == directory:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real_open(path, flags, *args, **kwargs)

        def unlink(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
            if kind == "read-only" and Path(path).parent == directory and os.path.lexists(path):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "unlink", unlink)

    def end(self) -> None:
        self._monkeypatch.undo()


STORAGE_ERRORS = {"full": "No space left on device", "read-only": "Read-only file system"}
STORAGE_FIXES = {"full": "is full: free space there", "read-only": "is read-only: remount it read-write"}


@pytest.mark.parametrize("kind", ["full", "read-only"])
@pytest.mark.parametrize("where", ["state", "cdi"])
@pytest.mark.parametrize("device", [f"{H100}-mig-1g10gb-0", H100], ids=["mig", "whole-gpu"])
def test_a_full_or_read_only_state_or_cdi_directory_fails_the_claim_naming_the_path_and_the_fix(
    h100: Node, monkeypatch: pytest.MonkeyPatch, kind: str, where: str, device: str
):
    """A per-claim error naming the file, the cause and the remedy; no temp file, no orphan CDI spec, the
    checkpoint unchanged, a partition carved for the claim destroyed; the re-sent prepare succeeds once the
    fault ends."""
    h100.cdi_dir.mkdir()
    assert h100.prepare(claim("kept", "gpu-0000-43-00-0"))[1] is None  # the checkpoint has something to lose
    checkpoint = h100.state_dir / "checkpoint.json"
    before, specs_before = checkpoint.read_bytes(), h100.cdi_files()
    directory = h100.state_dir if where == "state" else h100.cdi_dir
    fault = StorageFault(monkeypatch, directory, kind)
    _, error = h100.prepare(claim("u1", device))
    fault.end()
    assert error is not None
    path = str(checkpoint) if where == "state" else str(h100.cdi_dir / "k8s.gpu.dradriver.dev-claim_u1.json")
    assert path in error and STORAGE_ERRORS[kind] in error
    assert STORAGE_FIXES[kind] in error and f"--{where}-dir" in error
    assert h100.instances() == [] and h100.cdi_files() == specs_before
    assert not list(h100.state_dir.glob(".*.tmp")) and not list(h100.cdi_dir.glob(".*.tmp"))
    assert checkpoint.read_bytes() == before
    assert [r.uid for r in h100.driver.checkpoint.records()] == ["kept"]
    ids, error = h100.prepare(claim("u1", device))
    assert error is None and ids == [f"k8s.gpu.dradriver.dev/claim=u1-{device}"]
    assert h100.driver.unprepare_resource_claims([ref("u1"), ref("kept")]) == {"u1": None, "kept": None}
    h100.assert_clean()


@pytest.mark.parametrize("where", ["state", "cdi"])
def test_an_unprepare_on_a_read_only_directory_fails_and_the_re_sent_unprepare_finishes(
    h100: Node, monkeypatch: pytest.MonkeyPatch, where: str
):
    assert h100.prepare(claim("u1", f"{H100}-mig-1g10gb-0"))[1] is None
    fault = StorageFault(monkeypatch, h100.state_dir if where == "state" else h100.cdi_dir, "read-only")
    error = h100.driver.unprepare_resource_claims([ref("u1")])["u1"]
    fault.end()
    assert error is not None and STORAGE_ERRORS["read-only"] in error and f"--{where}-dir" in error
    assert not list(h100.state_dir.glob(".*.tmp")) and not list(h100.cdi_dir.glob(".*.tmp"))
    assert [r.uid for r in h100.driver.checkpoint.records()] == ["u1"]  # still recorded: the retry finishes it
    assert h100.driver.unprepare_resource_claims([ref("u1")]) == {"u1": None}
    h100.assert_clean()
    h100.restart().reconcile()
    h100.assert_clean()
