"""Prepare as a recorded transaction: the whole plan is checkpointed before the first change, the results once
after the last, and every change can be undone from its record plus what the hardware shows, in this process
or after a crash.

A step kind (:class:`StepKind`) is a name with its undo and its drift check, declared by the module that applies
it; :mod:`dradriver.driver.prepare.steps` registers them all. :meth:`Transaction.expect` declares a step before the
claim's first checkpoint write (its intent travels in the PrepareStarted record); :meth:`Transaction.run` makes a
change (writing its intent first only if it was not declared); the results are written with PrepareCompleted.
:meth:`Transaction.rollback` undoes what may have been done in reverse. Undos are idempotent and check the
hardware before destroying anything (an instance id may be reused by another claim after a crash), so a record
of intents, or of results from before a crash, is enough to undo. That makes a prepare two checkpoint writes and
an unprepare one, whatever the number of steps. A new feature (compute mode, MPS) is a new step kind: one module
that applies it and declares its :class:`StepKind`, plus its line in :mod:`dradriver.driver.prepare.steps`.

Test hook: ``DRADRIVER_TEST_CRASH_AT`` (see :mod:`dradriver.faults`) kills or fails at ``before:<step>``,
``after:<step>`` and ``undone:<step>`` of every step, so fault walks cover new steps without naming them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.driver.prepare.checkpoint import Action, CheckpointStore, ClaimRecord
from dradriver.errors import DradriverError
from dradriver.faults import CRASH_ENV, fault_point

log = logging.getLogger(__name__)

__all__ = ["CRASH_ENV", "Drift", "StepFailed", "StepKind", "Transaction", "Undo", "crash_point"]

#: Undo one recorded action. It must be idempotent (already undone is success): after a crash it may run again.
Undo = Callable[[ClaimRecord, Action], None]
#: How the node now differs from what a done action recorded (e.g. "compute mode of GPU-… changed to 0"), or None
#: when the change is still there. Read-only: start-up reconciliation asks it about every prepared claim.
Drift = Callable[[ClaimRecord, Action], str | None]


@dataclass(frozen=True)
class StepKind:
    """One kind of recorded change. Its apply is the ``change`` its module hands to :meth:`Transaction.run`;
    ``undo`` reverts it; ``drift`` (None: nothing to check) tells start-up whether it is still on the node."""

    name: str
    undo: Undo
    drift: Drift | None = None


def crash_point(name: str) -> None:
    """Kill or fail at ``name`` if the test hook names it (see :mod:`dradriver.faults`)."""
    fault_point(name)


class StepFailed(DradriverError):
    """A step of a claim's prepare failed; names the device, the step and the cause."""

    def __init__(self, device: str, step: str, cause: BaseException) -> None:
        self.device = device
        self.step = step
        self.cause = cause
        where = f"device {device}, step {step}" if device else f"step {step}"
        super().__init__(f"{where}: {cause}")


class Transaction:
    """The recorded changes of one claim; every change goes through :meth:`run`."""

    def __init__(self, record: ClaimRecord, store: CheckpointStore, kinds: Mapping[str, StepKind]) -> None:
        self.record = record
        self._store = store
        self._kinds = kinds
        self._declared: list[Action] = []  # expected and not started yet, in order

    def expect(self, step: str, device: str, params: dict[str, Any]) -> None:
        """Declare a step the claim will run, before its record is first written: the intent is then part of
        that write, and :meth:`run` of the step writes nothing."""
        if step not in self._kinds:
            raise ValueError(f"step {step!r} is not a registered step kind")
        action = Action(step=step, device=device, params=dict(params))
        self.record.actions.append(action)
        self._declared.append(action)

    def intent(self, step: str, device: str) -> dict[str, Any] | None:
        """The parameters a declared step that has not run yet was declared with (a copy), or None."""
        action = next((a for a in self._declared if a.step == step and a.device == device), None)
        return dict(action.params) if action is not None else None

    def run(
        self, step: str, device: str, params: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Call ``change(params)``, note its result (merged into ``params``) and return it.

        A declared step's intent is on disk already; any other step's intent is written first (before any
        later declared ones, so the record stays in the order of the changes). The result is written with the
        claim's completion: a crash before that leaves the intent only, and every undo handles an intent
        whose change may or may not have happened. If ``change`` raises, nothing was changed (NVML calls are
        all-or-nothing; a step that reads back after changing cleans up itself): the intent is dropped and
        :class:`StepFailed` raised."""
        if step not in self._kinds:
            raise ValueError(f"step {step!r} is not a registered step kind")
        action = next((a for a in self._declared if a.step == step and a.device == device), None)
        if action is not None:
            self._declared.remove(action)
            action.params.update(params)
            durable = False
        else:
            action = Action(step=step, device=device, params=dict(params))
            at = self.record.actions.index(self._declared[0]) if self._declared else len(self.record.actions)
            self.record.actions.insert(at, action)
            self._store.put(self.record)
            durable = True
        try:
            fault_point(f"before:{step}")
            result = change(dict(action.params))
        except DradriverError as err:
            self.record.actions.remove(action)
            if durable:
                # Written at once: after a crash, an undo of this intent might destroy what another party created
                # (an admin's instance at the placement this create was refused).
                self._store.put(self.record)
            raise StepFailed(device, step, err) from err
        action.params.update(result)
        action.done = True
        fault_point(f"after:{step}")
        return action.params

    def rollback(self, *, skip: Callable[[Action], bool] = lambda _a: False) -> str | None:
        """Undo the recorded actions in reverse (those ``skip`` selects, and declared steps never started, are
        dropped without undoing).

        Nothing is written while undoing: a crash mid-way leaves the record as it was, and undoing it again is
        safe (undos are idempotent and check the hardware). Returns None when everything was undone (the caller
        then removes the record: one write), else the error that stopped it (recorded in the checkpoint as
        ``rollbackError`` with the actions still to undo, for start-up to finish)."""
        for action in self._declared:
            self.record.actions.remove(action)
        self._declared = []
        while self.record.actions:
            action = self.record.actions[-1]
            if not skip(action):
                try:
                    kind = self._kinds.get(action.step)
                    if kind is None:
                        raise DradriverError(
                            f"this driver version cannot undo step {action.step!r} (a newer version recorded it); "
                            "run that version to unprepare the claim"
                        )
                    kind.undo(self.record, action)
                    fault_point(f"undone:{action.step}")
                except (DradriverError, KeyError, ValueError, TypeError) as err:  # also a malformed record
                    message = f"undoing {action.step} of {action.device or 'the claim'} failed: {err}"
                    log.error(
                        "rollback failed claim=%s step=%s device=%s error=%s",
                        self.record.uid,
                        action.step,
                        action.device,
                        err,
                    )
                    self.record.rollback_error = message
                    self._store.put(self.record)
                    return message
            self.record.actions.pop()
        return None
