"""The checks of a second driver instance, without NVIDIA's hook and with NVIDIA's consumable shares: the
container without a hook, and MPS for a claim (its daemon, a CUDA client in the container through the claim's
pipe and /dev/shm, the limits, the daemon stopped at unprepare). Runs inside the kit's venv."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from support.gpu_acceptance.container import Runtime
from support.gpu_acceptance.host import mounts_under
from support.gpu_acceptance.node import Node, attribute
from support.gpu_acceptance.node_checks import ALL_WORKLOADS, judge_container
from support.gpu_acceptance.report import CheckResult, judged
from support.gpu_acceptance.session import Recorder, SessionConfig, eventually

NOHOOK = [f"container-nohook-{w}" for w in ("nvidia-smi", "cuda", "opencl", "egl")]
SHARES = "4"  # --consumable-shares: the MPS claim takes 2 of 4, so its daemon's thread limit is 50 %
MPS_LIMIT = "4Gi"
EXPECTED_PERCENTAGE, EXPECTED_MEMORY_MIB = 50.0, 4096


def mps_control(cfg: SessionConfig) -> list[str]:
    """The control command the driver runs (the simulator's stand-in in a rehearsal)."""
    if cfg.real:
        return [cfg.mps_control]
    from dradriver.gpu.backend import simulated_mps_command

    return simulated_mps_command()


def mps_query(cfg: SessionConfig, pipe: Path, command: str) -> str:
    """Ask the claim's daemon ``command`` through its pipe directory, as a client would."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    done = subprocess.run(
        mps_control(cfg), input=command + "\n", capture_output=True, text=True, timeout=20, check=False, env=env
    )
    return (done.stdout + done.stderr).strip()


def processes_using(pipe: Path) -> list[int]:
    """PIDs whose environment names ``pipe`` as their MPS pipe directory: the claim's daemon and its servers."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def nohook_checks(node: Node, rec: Recorder, runtime: Runtime) -> None:
    """A plain share of a GPU (no config: nothing changed on it) in a container whose spec has no hooks."""
    claim = node.claim("acceptance-nohook")
    try:
        result = node.prepare(claim)
        if result.error:
            rec.fail(NOHOOK, f"prepare for the container: {result.error}")
            return
        [device] = result.devices
        gpu_uuid = next(attribute(d, "uuid") for d in node.gpus() if d["name"] == device["device_name"])
        run = runtime.run("nohook", node.dirs.cdi, list(device["cdi_device_ids"]), ALL_WORKLOADS)
        for checked in judge_container(run, "nohook", node.cfg, str(gpu_uuid)):
            rec.add(checked)
        start = runtime.run("nohook-true", node.dirs.cdi, list(device["cdi_device_ids"]), ["true"])
        rec.note("containerStartSecondsNoHook", round(start.seconds, 3))
    finally:
        rec.note("nohookUnprepare", node.unprepare(claim) or "ok")
        node.forget(claim)


def client_problems(run: Any) -> list[str]:
    """What the CUDA client in the MPS container got wrong (its own run, the pipe variable, the SM limit)."""
    if run.error:
        return [f"no container: {run.error}"]
    cuda = run.workloads.get("cuda")
    problems = []
    if cuda is None or cuda.rc != 0:
        problems.append(f"the CUDA client failed: {cuda.output.strip()[-500:] if cuda else 'no output'}")
    env = run.workloads.get("env")
    if env is None or "CUDA_MPS_PIPE_DIRECTORY=" not in env.output:
        problems.append("the container has no CUDA_MPS_PIPE_DIRECTORY")
    values = cuda.values if cuda else {}
    if "exec_affinity_sm_count" in values and values["exec_affinity_sm_count"] == values.get("multiprocessors"):
        problems.append(f"the client may use all {values['multiprocessors']} SMs: the thread limit did not reach it")
    return problems


def limit_problems(limits: dict[str, str]) -> list[str]:
    """The daemon's answers against the limits the claim's share and config ask for (read as numbers: the answer's
    form, ``50.0`` or ``4096M``, is the control tool's)."""
    problems = []
    percentage = re.match(r"^\s*(\d+(?:\.\d+)?)", limits["percentage"])
    if percentage is None or float(percentage.group(1)) != EXPECTED_PERCENTAGE:
        problems.append(f"thread limit {limits['percentage']!r}, wanted {EXPECTED_PERCENTAGE}")
    memory = re.match(r"^\s*(\d+)\s*M", limits["memory"])
    if memory is None or int(memory.group(1)) != EXPECTED_MEMORY_MIB:
        problems.append(f"memory limit {limits['memory']!r}, wanted {EXPECTED_MEMORY_MIB}M")
    return problems


def check_mps(node: Node, runtime: Runtime, held: dict[str, Any]) -> CheckResult:
    config = {"kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": MPS_LIMIT}}}
    claim = held["claim"] = node.claim("acceptance-mps", config=config, capacity={"shares": "2"})
    result = node.prepare(claim)
    if result.error:
        return judged("mps", [f"prepare: {result.error}"], "")
    [device] = result.devices
    gpu_uuid = next(attribute(d, "uuid") for d in node.gpus() if d["name"] == device["device_name"])
    pipe = held["pipe"] = node.dirs.mps(claim.uid) / "pipe"
    held["daemons"] = daemons = processes_using(pipe)
    limits = {
        "percentage": mps_query(node.cfg, pipe, "get_default_active_thread_percentage"),
        "memory": mps_query(node.cfg, pipe, f"get_default_device_pinned_mem_limit {gpu_uuid}"),
    }
    run = runtime.run("mps", node.dirs.cdi, list(device["cdi_device_ids"]), ["env", "shm", "cuda"])
    servers = mps_query(node.cfg, pipe, "get_server_list")
    problems = [] if daemons else [f"no process serves {pipe}"]
    problems += limit_problems(limits)
    problems += client_problems(run)
    if not servers.strip():
        problems.append("get_server_list is empty after the client ran: it did not go through the daemon")
    cuda = run.workloads.get("cuda")
    values = cuda.values if cuda else {}
    return judged(
        "mps",
        problems,
        f"daemon {daemons}, limits {limits['percentage']} % and {limits['memory']}, server {servers.split()}, "
        f"client SMs {values.get('exec_affinity_sm_count', '?')}/{values.get('multiprocessors', '?')}",
        limits=limits,
        servers=servers,
        client=values,
        shm=run.workloads["shm"].output if "shm" in run.workloads else "",
        controlLog=_tail(node.dirs.mps(claim.uid) / "log/control.log"),
        edits=run.edits,
    )


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as err:
        return f"({err})"


def check_mps_unprepare(node: Node, held: dict[str, Any]) -> CheckResult:
    claim = held["claim"]
    error = node.unprepare(claim)
    node.forget(claim)
    directory = node.dirs.mps(claim.uid)
    pipe = held.get("pipe", directory / "pipe")
    left = [] if eventually(lambda: not processes_using(pipe), 15) else processes_using(pipe)
    problems = [f"unprepare: {error}"] if error else []
    if left:
        problems.append(f"still serving {pipe}: pids {left}")
    if directory.exists():
        problems.append(f"{directory} is still there")
    mounts = mounts_under(node.dirs.plugin / "mps")
    if mounts:
        problems.append(f"still mounted: {mounts}")
    return judged("mps-unprepare", problems, f"daemon {held.get('daemons')} stopped; directories and tmpfs gone")


def mps_checks(node: Node, rec: Recorder, runtime: Runtime) -> None:
    cfg = node.cfg
    if cfg.real and not cfg.mps_control:
        rec.skip(["mps", "mps-unprepare"], "does not apply: the driver ships no nvidia-cuda-mps-control")
        return
    gpu_uuid = str(attribute(node.gpus()[0], "uuid"))
    found = cfg.found_modes.get(gpu_uuid, {}).get("computeMode", "unknown")
    if cfg.real and found != "Default":
        reason = f"does not apply: {gpu_uuid} runs in compute mode {found}; MPS shares need Default, never set here"
        rec.skip(["mps", "mps-unprepare"], reason)
        return
    held: dict[str, Any] = {}
    rec.timed("mps", lambda: check_mps(node, runtime, held))
    if "claim" in held:
        rec.timed("mps-unprepare", lambda: check_mps_unprepare(node, held))
    else:
        rec.skip(["mps-unprepare"], "no MPS claim was allocated")


def phase_without_hook(cfg: SessionConfig, rec: Recorder, api: Any, runtime: Runtime) -> None:
    """The second driver instance: specs without hooks, GPUs published as consumable shares."""
    node, problem = Node.start(cfg, api, "b", ["--nvidia-cdi-hook-path", "none", "--consumable-shares", SHARES])
    try:
        if problem:
            rec.fail([*NOHOOK, "mps", "mps-unprepare"], f"dradriver run without the hook: {problem}")
            return
        node.register()
        node.published()
        rec.guarded(NOHOOK, lambda: nohook_checks(node, rec, runtime))
        mps_checks(node, rec, runtime)
    except Exception as err:  # whatever broke, the checks not yet recorded say so
        rec.fail_missing([*NOHOOK, "mps", "mps-unprepare"], f"{type(err).__name__}: {err}")
    finally:
        rec.note("driverExitNoHook", node.close())
