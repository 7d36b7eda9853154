"""Hostile state on the node path: checkpoints (well-formed, with a valid checksum, but with any content) and
claim UIDs. Never a crash, never a path outside the configured directories."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.driver.cdi import CdiWriter
from dradriver.driver.checkpoint import KIND, CheckpointStore, checksum
from dradriver.driver.state import GpuDriver
from dradriver.gpu.catalog import load_node_profile
from dradriver.gpu.fakelib import simulated_gpulib_on
from dradriver.gpu.inventory import MigMode, discover
from dradriver.gpu.sim import SimulatedNode
from dradriver.plugin.handler import ClaimRef

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
        store = CheckpointStore.open(state, boot_id="b")
        try:
            driver = GpuDriver(
                driver_name="gpu.dradriver.dev",
                pool="node-a",
                inventory=discover(gpulib),
                mig_mode=MigMode.DYNAMIC,
                cdi=CdiWriter(root / "cdi"),
                gpulib=gpulib,
                checkpoint=store,
            )
            driver.reconcile(lambda _ref: False)  # the API server has none of them: unprepare them all
            for uid in claims:
                driver.unprepare_resource_claims([ClaimRef("ns", "n", uid)])  # an error per claim, never a raise
        finally:
            store.close()
        assert all(p.resolve().is_relative_to(root.resolve()) for p in root.rglob("*"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@given(uid=st.text(min_size=1, max_size=60))
def test_a_claim_uid_never_names_a_path_outside_the_cdi_directory(uid: str) -> None:
    cdi_dir = Path("/var/run/cdi")
    path = CdiWriter(cdi_dir).spec_path(uid)
    assert path.parent == cdi_dir and "/" not in path.name
