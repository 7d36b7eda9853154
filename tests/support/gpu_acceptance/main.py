"""``scripts/gpu-acceptance``: prepare the kit (``--prepare``, where there is network), or run every check of
:data:`~support.gpu_acceptance.report.CHECKS` on this machine's GPU and write one report. Standard library only:
on the GPU machine this runs before the kit's venv exists, and starts that venv's interpreter for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from support.gpu_acceptance import host, report
from support.gpu_acceptance.host_checks import (
    Context,
    check_doctor,
    check_inventory,
    check_nvml_contract,
    check_nvml_release,
    check_usage_nvml,
)
from support.gpu_acceptance.host_workloads import check_workloads_on_host
from support.gpu_acceptance.kit import DEFAULT_KIT, REPO, install_venv, manifest, unpack, venv_python
from support.gpu_acceptance.left_as_found import check_left_as_found
from support.gpu_acceptance.report import CheckResult, Report, failed, skipped
from support.gpu_acceptance.session import SessionConfig

DEFAULT_DEADLINE_S = 420.0  # the whole run, kit set-up included: inside the 8 minutes the issue allows, with margin
HOST_CHECKS: tuple[tuple[str, Callable[[Context], CheckResult]], ...] = (
    ("nvml-contract", check_nvml_contract),
    ("doctor", check_doctor),
    ("inventory-vs-nvidia-smi", check_inventory),
    ("usage-nvml", check_usage_nvml),
    ("nvml-release", check_nvml_release),
    ("workloads-on-host", check_workloads_on_host),
)
SESSION_CHECKS = report.CHECK_NAMES[report.CHECK_NAMES.index("run-registration") : -1]
LOGS = ("driver-a.log", "driver-b.log")
SESSION_STOP_S = 20.0  # for the node session to unprepare and stop its drivers once told to stop


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-acceptance",
        description="Prove the driver on this machine's NVIDIA GPU in one offline run (docs/development.md); "
        "--prepare builds the kit it needs where there is network. Exit 0: every check that applies held; 1: a "
        "check failed; 2: the kit could not run; 3: no GPU here, every check skipped.",
    )
    parser.add_argument("--prepare", action="store_true", help="build the kit (needs network; no GPU)")
    parser.add_argument("--kit", type=Path, default=DEFAULT_KIT, help=f"the kit folder (default: {DEFAULT_KIT})")
    parser.add_argument("--out", type=Path, help="where report.json, summary.txt and the logs go (default: WORK/out)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new /tmp/gpu-acc-*)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for the whole run")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run the checks on the simulated node with this interpreter, without a GPU: a dry run of the kit "
        "itself (runc, the CDI applier, both driver instances, MPS with the stand-in); what needs a GPU fails",
    )
    parser.add_argument("--python", help="the interpreter for the checks (default: a venv from the kit's wheels)")
    return parser.parse_args(argv)


def timed(ctx: Context, rep: Report, name: str, check: Callable[[Context], CheckResult]) -> None:
    if ctx.remaining() < 15:
        rep.add(skipped(name, "out of time: the run's deadline is near"))
        return
    started = time.monotonic()
    try:
        result = check(ctx)
    except Exception as err:  # any error is this check's failure; the next check still runs
        result = failed(name, f"{type(err).__name__}: {err}")
    result.seconds = round(time.monotonic() - started, 2)
    rep.add(result)


def set_up(ctx: Context, kit: Path, args: argparse.Namespace) -> str:
    """Unpack the kit and make the checks' interpreter; '' when ready, else why not."""
    if manifest(kit) is None:
        return f"no prepared kit at {kit}: run scripts/gpu-acceptance --prepare where there is network, carry it"
    ctx.kit = unpack(kit, ctx.work / "kit")
    missing = ctx.kit.missing()
    if missing:
        return f"the kit lacks {missing}: prepare it again"
    target = str((manifest(kit) or {}).get("targetPython", ""))
    if args.python or (args.rehearse and f"{sys.version_info.major}.{sys.version_info.minor}" != target):
        # A rehearsal on another Python than the wheels': the interpreter at hand, with the checkout's src.
        ctx.python = args.python or sys.executable
        return ""
    problem = install_venv(kit, ctx.work / "venv", target, timeout=max(30.0, ctx.remaining() - 120))
    # The dependencies from the kit's wheels, dradriver from the checkout that travelled with it (also what pytest's
    # pythonpath gives the contract tests): every check runs the same driver code, the commit the report names.
    ctx.python = str(venv_python(ctx.work / "venv"))
    return problem


def cgroup_mounted(rep: Report) -> bool:
    """Mount a cgroup2 hierarchy for runc when the machine has none (recorded, unmounted at the end)."""
    missing = host.cgroup_ready()
    rep.host["cgroup"] = missing or "present"
    if not missing or os.geteuid() != 0:
        return False
    code, text = host.run_text(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])
    rep.host["cgroup"] = f"{missing}: mounted cgroup2 for the run" if code == 0 else f"{missing}; mount failed: {text}"
    return code == 0


def session_config(ctx: Context) -> SessionConfig:
    assert ctx.kit is not None
    return SessionConfig(
        repo=str(ctx.repo),
        work=str(ctx.work / "node"),
        kit_root=str(ctx.kit.root),
        backend="sim" if ctx.rehearse else "nvml",
        results=str(ctx.work / "session.json"),
        logs=str(ctx.work / "logs"),
        mps_control=host.find_tool("nvidia-cuda-mps-control") or "",
        smi_gpus=ctx.smi,
        found_modes=ctx.found,
        host_probes=ctx.host_probes,
        deadline=time.time() + ctx.remaining() - SESSION_STOP_S,
    )


def run_session(ctx: Context, rep: Report) -> dict[str, object]:
    """The node session in the checks' interpreter, its results merged into ``rep``; returns its notes."""
    cfg = session_config(ctx)
    (ctx.work / "node").mkdir(parents=True, exist_ok=True)
    (ctx.work / "logs").mkdir(parents=True, exist_ok=True)
    cfg.save(ctx.work / "session-config.json")
    command = [ctx.python, "-m", "support.gpu_acceptance.node_session", str(ctx.work / "session-config.json")]
    with (ctx.out / "node-session.txt").open("w") as log:
        proc = subprocess.Popen(
            command, cwd=ctx.repo, env=ctx.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        stopped: BaseException | None = None
        try:
            code = proc.wait(max(10.0, ctx.remaining() - SESSION_STOP_S - 30))
        except subprocess.TimeoutExpired:
            code = stop_session(proc)
        except BaseException as err:  # this run is being stopped: the session unprepares what it holds first
            code, stopped = stop_session(proc), err
    try:
        document = json.loads(Path(cfg.results).read_text())
    except (OSError, ValueError):
        document = {}
    for entry in document.get("results", []):
        rep.add(CheckResult(**entry))
    tail = (ctx.out / "node-session.txt").read_text()[-800:]
    for name in SESSION_CHECKS:
        if name not in rep.results:
            rep.add(failed(name, f"the node session ended (exit {code}) before this check: {tail}"))
    notes: dict[str, object] = document.get("notes", {})
    if stopped is not None:
        raise stopped  # after its results are in the report
    return notes


def stop_session(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, so that the session unprepares its claims and stops its drivers and containers; SIGKILL to
    whatever of its process group is left after :data:`SESSION_STOP_S`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(SESSION_STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def host_facts(ctx: Context, rep: Report) -> None:
    """What nvidia-smi says before anything runs: the GPUs, the driver, each GPU's compute and MIG mode."""
    ctx.smi = [] if ctx.rehearse else host.smi_gpus()
    ctx.found = host.gpu_modes(ctx.smi)
    rep.host.update(
        path=os.environ.get("PATH", ""),
        tools={name: host.find_tool(name) for name in ("nvidia-smi", "nvidia-cuda-mps-control", "ldconfig")},
        driverVersion=ctx.smi[0].get("driver_version") if ctx.smi else None,
        gpuNames=[g.get("name", "?") for g in ctx.smi] or (["simulated hgx-h100-80gb"] if ctx.rehearse else []),
        gpus=ctx.smi,
        foundModes=ctx.found,
    )


def run_checks(ctx: Context, rep: Report, args: argparse.Namespace) -> None:
    host_facts(ctx, rep)
    problem = set_up(ctx, args.kit, args)
    rep.host["kitSetUpSeconds"] = round(time.monotonic() - (ctx.deadline - args.deadline), 1)
    if problem:
        rep.host["kitProblem"] = problem
        for name in report.CHECK_NAMES:
            rep.add(failed(name, f"the kit could not run: {problem}"))
        return
    mounted = cgroup_mounted(rep)
    try:
        for name, check in HOST_CHECKS:
            timed(ctx, rep, name, check)
        notes = run_session(ctx, rep) if ctx.remaining() > 60 else {}
        rep.host["notes"] = notes
        timed(ctx, rep, "left-as-found", lambda c: check_left_as_found(c, notes))
    finally:
        if mounted:
            host.run_text(["umount", "/sys/fs/cgroup"])
        for name in LOGS:
            if (ctx.work / "logs" / name).exists():
                (ctx.out / name).write_text((ctx.work / "logs" / name).read_text())


def code_facts(kit: Path) -> dict[str, object]:
    """Which driver code runs (the checkout that travelled), and whether it is what the kit was prepared from."""
    prepared = manifest(kit) or {}
    src = host.tree_hash(REPO / "src")
    return {
        "preparedFrom": prepared.get("commit"),
        "srcHash": src,
        "srcChangedSincePrepare": bool(prepared) and prepared.get("srcHash") != src,
    }


def finish(rep: Report, out: Path) -> int:
    document = rep.document()
    if rep.host.get("kitProblem"):
        document["exitStatus"] = report.EXIT_UNUSABLE
    json_path, _ = report.write(document, out)
    sys.stdout.write(report.summary(document))
    print(f"report: {json_path}", file=sys.stderr)
    return int(document["exitStatus"])


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.prepare:
        from support.gpu_acceptance.prepare import prepare

        return prepare(args.kit.resolve())
    started = time.monotonic()  # the deadline counts from here: nvidia-smi's first answer may take a while
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-acc-", dir="/tmp"))
    out = args.out or work / "out"
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(rehearsal=args.rehearse)
    presence = host.gpu_presence()
    rep.host.update(gpu=presence.present, gpuPresence=presence.why, **code_facts(args.kit))
    if not presence.present and not args.rehearse:
        rep.skip_rest(f"no GPU: skipped ({presence.why})")
        return finish(rep, out)
    rep.out = out  # from here on report.json follows every result
    ctx = Context(REPO, work, out, sys.executable, started + args.deadline, rehearse=args.rehearse)
    # Whoever stops this run (the device tool past its time limit) gets the report of what ran, and the session's
    # claims unprepared: SIGTERM unwinds like an error.
    signal.signal(signal.SIGTERM, _stopped)
    try:
        run_checks(ctx, rep, args)
    except BaseException as err:  # the kit's own failure, or a stop: the report says so and keeps what held
        rep.host["kitProblem"] = f"the kit stopped: {type(err).__name__}: {err}"
        rep.host["kitTraceback"] = traceback.format_exc()[-2000:]
    return finish(rep, out)


class Stopped(Exception):
    """SIGTERM arrived: the run ends, reporting what it found."""


def _stopped(signum: int, _frame: object) -> None:
    raise Stopped(f"signal {signal.Signals(signum).name}")
