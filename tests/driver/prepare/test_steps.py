"""The step registry: every kind a prepare records is registered once, with its undo and its drift check."""

from pathlib import Path

import pytest

from dradriver.driver.prepare.cdi_step import STEP_CDI_SPEC, CdiSpecStep
from dradriver.driver.prepare.checkpoint import Action, CheckpointStore, ClaimRecord, ClaimState
from dradriver.driver.prepare.mig import STEP_COMPUTE_INSTANCE, STEP_GPU_INSTANCE, STEP_MIG_MODE, MigSteps
from dradriver.driver.prepare.sharing import STEP_COMPUTE_MODE, STEP_MPS_DAEMON, STEP_TIME_SLICE, SharingSteps
from dradriver.driver.prepare.steps import step_kinds
from dradriver.driver.prepare.transaction import Transaction
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.sim.fakelib import simulated_gpulib


def test_every_step_kind_is_registered_with_its_drift_check(tmp_path: Path) -> None:
    gpulib, _ = simulated_gpulib("dgx-a100-80gb", node_name="n")
    try:
        kinds = step_kinds(
            cdi=CdiSpecStep(CdiWriter(tmp_path)),
            sharing=SharingSteps(gpulib, CheckpointStore(), None),
            mig=MigSteps(gpulib),
        )
    finally:
        gpulib.close()
    assert set(kinds) == {
        STEP_CDI_SPEC,
        STEP_COMPUTE_MODE,
        STEP_TIME_SLICE,
        STEP_MPS_DAEMON,
        STEP_MIG_MODE,
        STEP_GPU_INSTANCE,
        STEP_COMPUTE_INSTANCE,
    }
    assert all(kinds[name].drift is not None for name in (STEP_CDI_SPEC, STEP_COMPUTE_MODE, STEP_MPS_DAEMON))
    assert all(kinds[name].drift is not None for name in (STEP_GPU_INSTANCE, STEP_COMPUTE_INSTANCE))


def test_a_driver_without_gpu_access_has_no_mig_steps(tmp_path: Path) -> None:
    kinds = step_kinds(
        cdi=CdiSpecStep(CdiWriter(tmp_path)), sharing=SharingSteps(None, CheckpointStore(), None), mig=None
    )
    assert STEP_GPU_INSTANCE not in kinds and STEP_CDI_SPEC in kinds


def test_a_transaction_refuses_a_step_that_is_not_registered(tmp_path: Path) -> None:
    kinds = step_kinds(
        cdi=CdiSpecStep(CdiWriter(tmp_path)), sharing=SharingSteps(None, CheckpointStore(), None), mig=None
    )
    record = ClaimRecord(uid="u", namespace="ns", name="c", state=ClaimState.PREPARE_STARTED, devices=[])
    txn = Transaction(record, CheckpointStore(), kinds)
    with pytest.raises(ValueError, match="not a registered step kind"):
        txn.expect("firmware-flash", "gpu-0", {})


def test_the_cdi_spec_drifts_when_its_file_is_gone(tmp_path: Path) -> None:
    step = CdiSpecStep(CdiWriter(tmp_path))
    written = Action(step=STEP_CDI_SPEC, device="", params={}, done=True)
    record = ClaimRecord(uid="u", namespace="ns", name="c", state=ClaimState.PREPARE_COMPLETED, actions=[written])
    step.cdi.spec_path("u").write_text("{}")
    assert not step.spec_missing(record)
    step.cdi.spec_path("u").unlink()
    assert step.spec_missing(record)
    assert "missing" in str(step.drift(record, record.actions[0]))
