"""Hostile state on the node path: checkpoints (well-formed, with a valid checksum, but with any content) and
claim UIDs. Never a crash, never a path outside the configured directories."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.written_paths import outside, recorded_writes

from dradriver.driver.prepare.checkpoint import KIND, CheckpointStore, checksum
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import ClaimRef
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=12))
params = st.dictionaries(
    st.sampled_from(
        [
            "gpuUUID",
            "gpu",
            "profileId",
            "start",
            "gpuInstanceId",
            "computeInstanceId",
            "enabled",
            "previous",
            "reset",
            "x",
        ]
    ),
    st.one_of(scalars, st.just("GPU-00000000-0000-0000-0000-000000001b00"), st.integers(0, 8)),
)
actions = st.fixed_dictionaries(
    {
        "step": st.sampled_from(["mig-mode", "gpu-instance", "compute-instance", "cdi-spec", "future-step"]),
        "device": st.text(max_size=20),
        "params": params,
        "done": st.booleans(),
    }
)
devices = st.fixed_dictionaries(
    {
        "name": st.text(max_size=30),
        "gpu": st.sampled_from(["gpu-0000-1b-00-0", "nope", ""]),
        "gpuUUID": st.text(max_size=20),
        "kind": st.sampled_from(["gpu", "mig", "other"]),
    },
    optional={"placementStart": st.integers(-2, 9), "placementSize": st.integers(-1, 9), "profileId": scalars},
)
claims = st.dictionaries(
    st.text(min_size=1, max_size=40),
    st.fixed_dictionaries(
        {
            "namespace": st.text(max_size=10),
            "name": st.text(max_size=10),
            "state": st.sampled_from(["PrepareStarted", "PrepareCompleted"]),
            "devices": st.lists(devices, max_size=2),
            "actions": st.lists(actions, max_size=4),
        }
    ),
    max_size=3,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claims=claims)
def test_any_checkpoint_is_reconciled_and_unprepared_without_a_crash(claims: dict[str, Any]) -> None:
    root = Path(tempfile.mkdtemp(prefix="dra-hostile-"))
    try:
        state = root / "state"
        state.mkdir()
        data = {"bootId": "b", "claims": claims}
        doc = {"kind": KIND, "version": "1.0", "checksum": checksum(data), "data": data}
        (state / "checkpoint.json").write_text(json.dumps(doc))
        sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
        gpulib = simulated_gpulib_on(sim)
        with recorded_writes() as written:
            store = CheckpointStore.open(state, boot_id="b")
            try:
                driver = GpuDriver(
                    GpuDriverOptions(driver_name="gpu.dradriver.dev", pool="node-a", mig_mode=MigMode.DYNAMIC),
                    inventory=discover(gpulib),
                    cdi=CdiWriter(root / "cdi"),
                    gpulib=gpulib,
                    checkpoint=store,
                )
                driver.reconcile(lambda _ref: False)  # the API server has none of them: unprepare them all
                for uid in claims:
                    driver.unprepare_resource_claims([ClaimRef("ns", "n", uid)])  # an error per claim, never a raise
            finally:
                store.close()
        assert outside(written, root) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


@given(uid=st.text(min_size=1, max_size=60))
def test_a_claim_uid_never_names_a_path_outside_the_cdi_directory(uid: str) -> None:
    cdi_dir = Path("/var/run/cdi")
    path = CdiWriter(cdi_dir).spec_path(uid)
    assert path.parent == cdi_dir and "/" not in path.name


# --- the node's other state files -----------------------------------------------------------------------------

json_docs = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
CONDITION_FIELDS = [
    "gpu_uuid",
    "cause",
    "value",
    "effect",
    "since",
    "last_seen",
    "message",
    "count",
    "gpu_instance_id",
    "ecc_seen",
    "x",
]
health_docs = st.one_of(
    json_docs,
    st.fixed_dictionaries(
        {"kind": st.just("dradriver-health-state"), "version": st.just(1)},
        optional={
            "gpus": st.one_of(
                json_docs, st.lists(st.dictionaries(st.sampled_from(["index", "uuid", "name"]), json_docs))
            ),
            "conditions": st.one_of(
                json_docs,
                st.lists(
                    st.dictionaries(
                        st.sampled_from(CONDITION_FIELDS),
                        st.one_of(
                            json_docs,
                            st.sampled_from(
                                [
                                    "xid",
                                    "NoExecute",
                                    "GPU-00000000-0000-0000-0000-000000001b00",
                                    "NoSchedule",
                                    "*",
                                    1e308,
                                ]
                            ),
                        ),
                    ),
                    max_size=3,
                ),
            ),
        },
    ),
)


def _node() -> tuple[SimulatedNode, Any]:
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
    return sim, discover(simulated_gpulib_on(sim))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=health_docs, raw=st.one_of(st.none(), st.binary(max_size=40)))
def test_any_device_health_file_is_read_or_ignored_never_a_crash(doc: Any, raw: bytes | None) -> None:
    from dradriver.driver.observe.health import STATE_KIND, GpuHealth

    assert STATE_KIND == "dradriver-health-state"
    root = Path(tempfile.mkdtemp(prefix="dra-hostile-"))
    try:
        path = root / "health.json"
        path.write_bytes(raw if raw is not None else json.dumps(doc).encode())
        _sim, inventory = _node()
        with recorded_writes() as written:
            health = GpuHealth(inventory=inventory, mig_mode=MigMode.DYNAMIC, pool="node-a", state_path=path)
            health.taints("gpu-0000-1b-00-0")
            for device in inventory.devices(MigMode.DYNAMIC)[:3]:
                health.problem(device.name, ())
            health.update_inventory(inventory, MigMode.DYNAMIC)
        assert outside(written, root) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_health_file_nested_deeper_than_json_goes_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dradriver.driver.observe.health import GpuHealth
    from dradriver.plugin.handler import HealthStatus

    path = tmp_path / "health.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    _sim, inventory = _node()
    health = GpuHealth(inventory=inventory, mig_mode=MigMode.DYNAMIC, pool="node-a", state_path=path)
    assert "ignoring unreadable device health file" in caplog.text
    # Health starts clean: every device healthy, as with no file.
    devices = inventory.devices(MigMode.DYNAMIC)
    assert {health.status(d.name) for d in devices} == {(HealthStatus.HEALTHY, "")}


@st.composite
def damaged_sim_states(draw: st.DrawFn) -> Any:
    """A real simulator state file with a few values replaced by anything."""
    sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
    sim.set_mig_mode(0, True)
    sim.create_gpu_instance(0, 19, 0)
    doc: Any = json.loads(json.dumps(sim._state()))
    for _ in range(draw(st.integers(1, 3))):
        parent: Any = doc
        while True:
            keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = parent[key]
            if isinstance(child, dict | list) and child and draw(st.booleans()):
                parent = child
                continue
            parent[key] = draw(json_docs)
            break
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=damaged_sim_states())
def test_any_damaged_simulator_state_is_loaded_or_refused_naming_the_field(doc: Any) -> None:
    from dradriver.errors import ConfigError

    root = Path(tempfile.mkdtemp(prefix="dra-hostile-"))
    try:
        path = root / "sim.json"
        path.write_text(json.dumps(doc))
        try:
            sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a", state_path=path)
        except ConfigError as err:
            assert str(err).startswith(f"simulated GPU state file {path}: "), err
            return
        discover(simulated_gpulib_on(sim))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# What start-up may find in the CDI and MPS directories: our specs and temp files, other vendors' files, and things
# that are not regular files (directories, links out of the directory, FIFOs) under names that look like ours.
leftover_names = st.one_of(
    st.builds(
        lambda uid, ext: f"k8s.gpu.dradriver.dev-claim_{uid}{ext}",
        st.sampled_from(["u1", "..", "", "a b", "x.json"]),
        st.sampled_from([".json", ".yaml", ""]),
    ),
    st.builds(lambda uid: f".k8s.gpu.dradriver.dev-claim_{uid}.abc.tmp", st.sampled_from(["u1", "u2"])),
    st.sampled_from(["nvidia.com-gpu.json", "other.yaml", "gpu.dradriver.dev-metadata_u1.json", "u1", "u2", ".."]),
)
leftover_kinds = st.sampled_from(["file", "dir", "link-out-file", "link-out-dir", "fifo"])


def _make(path: Path, kind: str, outside: Path) -> None:
    if path.name in ("", "..", ".") or path.exists() or path.is_symlink():
        return
    if kind == "file":
        path.write_text("{}")
    elif kind == "dir":
        path.mkdir()
        (path / "pipe").mkdir()
    elif kind == "link-out-file":
        path.symlink_to(outside / "precious.json")
    elif kind == "link-out-dir":
        path.symlink_to(outside)
    else:
        os.mkfifo(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cdi=st.lists(st.tuples(leftover_names, leftover_kinds), max_size=5),
    mps=st.lists(st.tuples(leftover_names, leftover_kinds), max_size=4),
)
def test_start_up_clears_only_its_own_leftovers_and_never_follows_a_link_out(
    cdi: list[tuple[str, str]], mps: list[tuple[str, str]]
) -> None:
    from dradriver.driver.prepare.mps import MpsControl

    root = Path(tempfile.mkdtemp(prefix="dra-hostile-"))
    try:
        outside = root / "outside"
        outside.mkdir()
        (outside / "precious.json").write_text("keep")
        (outside / "pipe").mkdir()
        for base, entries in ((root / "cdi", cdi), (root / "state" / "mps", mps)):
            base.mkdir(parents=True)
            for name, kind in entries:
                _make(base / name, kind, outside)
        before = {
            p: p.lstat().st_mode
            for p in (root / "cdi").iterdir()
            if not p.name.startswith("k8s.gpu.dradriver.dev-claim_")
            and not p.name.startswith(".k8s.gpu.dradriver.dev-claim_")
        }
        sim, inventory = _node()
        store = CheckpointStore.open(root / "state", boot_id="b")
        try:
            driver = GpuDriver(
                GpuDriverOptions(driver_name="gpu.dradriver.dev", pool="node-a", mig_mode=MigMode.DYNAMIC),
                inventory=inventory,
                cdi=CdiWriter(root / "cdi"),
                gpulib=simulated_gpulib_on(sim),
                checkpoint=store,
                mps=MpsControl(
                    [sys.executable, "-m", "dradriver.sim.mps_standin"], root / "state" / "mps", ready_timeout_s=2
                ),
            )
            driver.reconcile(lambda _ref: True)
            assert driver.sharing.mps is not None and driver.sharing.mps.claim_uids() == []  # no record, no daemon
        finally:
            store.close()
        # Nothing outside was touched; other vendors' files are kept; our regular spec files are gone.
        assert (outside / "precious.json").read_text() == "keep" and (outside / "pipe").is_dir()
        assert sorted(p.name for p in outside.iterdir()) == ["pipe", "precious.json"]
        for path, mode in before.items():
            assert path.lstat().st_mode == mode
        assert not [
            p for p in (root / "cdi").glob("k8s.gpu.dradriver.dev-claim_*.json") if p.is_file() and not p.is_symlink()
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_write_recorder_sees_what_is_written_outside_the_directory(tmp_path: Path) -> None:
    inside, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    inside.mkdir()
    with recorded_writes() as written:
        (inside / "a.json").write_text("{}")
        (inside / ".." / "elsewhere").mkdir()
        os.replace(inside / "a.json", elsewhere / "b.json")
        (inside / "read.json").touch()
        (inside / "read.json").read_text()
    assert outside(written, inside) == [elsewhere, elsewhere / "b.json"]
    assert inside / "a.json" in written and inside / "read.json" in written
