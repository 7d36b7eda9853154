"""The node session: both driver instances on this host's GPUs against the API stand-in, in the kit's venv.

    python -m support.gpu_acceptance.node_session CONFIG.json

CONFIG.json is a :class:`~support.gpu_acceptance.session.SessionConfig`; the results go to its ``results`` file as
they come (the outer kit reads them, and fails what is missing if this process dies).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from support.apiserver import FakeApiServer
from support.gpu_acceptance.container import Runtime
from support.gpu_acceptance.kit import Unpacked
from support.gpu_acceptance.mps_checks import phase_without_hook
from support.gpu_acceptance.node_checks import phase_with_hook
from support.gpu_acceptance.report import CHECK_NAMES
from support.gpu_acceptance.session import NODE, Recorder, SessionConfig

#: The checks this session owns, in catalogue order.
SESSION_CHECKS = CHECK_NAMES[CHECK_NAMES.index("run-registration") : CHECK_NAMES.index("left-as-found")]
WITH_HOOK = SESSION_CHECKS[: SESSION_CHECKS.index("container-nohook-nvidia-smi")]


def run_session(cfg: SessionConfig) -> None:
    rec = Recorder(Path(cfg.results), cfg.deadline)
    runtime = Runtime(Unpacked(Path(cfg.kit_root)), Path(cfg.work))
    try:
        # The slices are judged by slice_rules and our validator in the checks, so the stand-in stores without its
        # schema check (whose package is too large to carry).
        with FakeApiServer(validate=False) as api:
            api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            # Each phase stops its driver instance (unpreparing what it holds) however it ends; an error fails the
            # phase's checks still without a result, and the next phase runs.
            rec.guarded(WITH_HOOK, lambda: phase_with_hook(cfg, rec, api, runtime))
            rec.skip_missing(WITH_HOOK, "not reached: an earlier check of the first driver instance failed")
            phase_without_hook(cfg, rec, api, runtime)
    finally:
        rec.note("containersLeft", runtime.leftovers())


def main(argv: list[str]) -> int:
    # The outer kit stops a session that runs out of time with SIGTERM: unwind, so the phases' own `finally`
    # stop the drivers and the claims they hold are unprepared.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    run_session(SessionConfig.load(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
