"""Prepare as a recorded transaction: each change is checkpointed before it is made and after, and can be undone
from its record alone, in this process or after a crash.

A step kind is a name with an undo (:class:`Undo`). :meth:`Transaction.run` records the intent, makes the change,
records the result; :meth:`Transaction.rollback` undoes the recorded actions in reverse. A new feature (compute
mode, MPS, claim status) is a new step kind, not a new branch inside prepare.

Test hook: ``DRADRIVER_TEST_CRASH_AT`` names crash points (comma-separated): ``prepare-started`` (the claim is
checkpointed as PrepareStarted), ``before:<step>`` (its intent is checkpointed, the change not yet made) and
``after:<step>`` (the change is made and checkpointed). At a named point the process SIGKILLs itself, so tests
can check that start-up recovery leaves nothing behind. Never set it outside tests.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from dradriver.driver.checkpoint import Action, CheckpointStore, ClaimRecord
from dradriver.errors import DradriverError

log = logging.getLogger(__name__)

CRASH_ENV = "DRADRIVER_TEST_CRASH_AT"

#: Undo one recorded action. It must be idempotent (already undone is success): after a crash it may run again.
Undo = Callable[[ClaimRecord, Action], None]


def crash_point(name: str) -> None:
    """SIGKILL this process if ``DRADRIVER_TEST_CRASH_AT`` names ``name`` (a test hook; see module docstring)."""
    wanted = os.environ.get(CRASH_ENV)
    if wanted and name in wanted.split(","):
        log.warning("test hook: killing the process at crash point %s", name)
        die()


def die() -> None:
    """SIGKILL this process; in-process tests replace it with one that raises, to stop where a crash would."""
    os.kill(os.getpid(), signal.SIGKILL)


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

    def __init__(self, record: ClaimRecord, store: CheckpointStore, undo: Mapping[str, Undo]) -> None:
        self.record = record
        self._store = store
        self._undo = undo

    def run(
        self, step: str, device: str, params: dict[str, Any], change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Record the intent (durably, with the results of earlier steps), call ``change(params)``, note its
        result (merged into ``params``) and return it.

        The result is written with the next checkpoint write (the next intent, or the claim's completion): a
        crash before that leaves the intent only, and every undo handles an intent whose change may or may not
        have happened. That halves the writes (each one two fsyncs) without losing anything recovery needs.
        If ``change`` raises, nothing was changed (NVML calls are all-or-nothing; a step that reads back after
        changing cleans up itself), so the intent is dropped and :class:`StepFailed` raised."""
        if step not in self._undo:
            raise ValueError(f"step {step!r} has no undo registered")
        action = Action(step=step, device=device, params=dict(params))
        self.record.actions.append(action)
        self._store.put(self.record)
        crash_point(f"before:{step}")
        try:
            result = change(dict(action.params))
        except DradriverError as err:
            # Written at once: after a crash, an undo of this intent might destroy what another party created
            # (an admin's instance at the placement this create was refused).
            self.record.actions.remove(action)
            self._store.put(self.record)
            raise StepFailed(device, step, err) from err
        action.params.update(result)
        action.done = True
        crash_point(f"after:{step}")
        return action.params

    def rollback(self, *, skip: Callable[[Action], bool] = lambda _a: False) -> str | None:
        """Undo the recorded actions in reverse (those ``skip`` selects are dropped without undoing).

        Each undone action leaves the record at once, so a crash mid-way redoes only what is left. Returns None
        when everything was undone, else the error that stopped it (recorded in the checkpoint as
        ``rollbackError`` with the actions still to undo, for start-up to finish)."""
        while self.record.actions:
            action = self.record.actions[-1]
            if not skip(action):
                try:
                    undo = self._undo.get(action.step)
                    if undo is None:
                        raise DradriverError(
                            f"this driver version cannot undo step {action.step!r} (a newer version recorded it); "
                            "run that version to unprepare the claim"
                        )
                    undo(self.record, action)
                except (DradriverError, KeyError) as err:
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
            self._store.put(self.record)
        return None
