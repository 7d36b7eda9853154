"""The last check: the GPU and the host as they were found. Compute and MIG modes per GPU (read again with
nvidia-smi), no MPS daemon or server, no CDI spec, container or mount of ours left, every driver instance ended
cleanly at SIGTERM."""

from __future__ import annotations

import os
from typing import Any

from support.gpu_acceptance import host
from support.gpu_acceptance.host_checks import Context
from support.gpu_acceptance.report import CheckResult, judged


def check_left_as_found(ctx: Context, notes: dict[str, Any]) -> CheckResult:
    problems = []
    now = host.gpu_modes(host.smi_gpus()) if not ctx.rehearse else {}
    if not ctx.rehearse and not ctx.found:
        problems.append("the GPUs' modes were never read: nvidia-smi answered no query at the start")
    for uuid, found in ctx.found.items():
        current = now.get(uuid)
        if current != found:
            problems.append(f"{uuid}: found {found}, now {current}")
    problems += [f"MPS process left: {p}" for p in host.mps_processes(ctx.work)]
    # doctor's specs in work/doctor/cdi, each driver instance's in work/node/<a|b>/cdi.
    specs = sorted(str(p) for pattern in ("*/cdi/*.json", "node/*/cdi/*.json") for p in ctx.work.glob(pattern))
    problems += [f"CDI spec left: {s}" for s in specs]
    problems += [f"mount left: {m}" for m in host.mounts_under(ctx.work)]
    # What runc still knows of, asked here too: a session stopped from outside noted nothing.
    containers = set(notes.get("containersLeft") or []) | set(runc_containers(ctx))
    problems += [f"container left: {c}" for c in sorted(containers)]
    for key in ("driverExitHook", "driverExitNoHook"):
        if key not in notes:
            problems.append(f"{key}: unknown, the node session ended before it stopped that driver instance")
        elif notes[key] != 0:
            problems.append(f"{key}: dradriver run exited {notes[key]} at SIGTERM")
    modes = ", ".join(f"{u}: {m['computeMode']}, MIG {m['migMode']}" for u, m in ctx.found.items()) or "simulated node"
    return judged("left-as-found", problems, f"as found ({modes}); nothing of ours left", found=ctx.found, now=now)


def runc_containers(ctx: Context) -> list[str]:
    """The containers the node session's runc state still lists."""
    state = ctx.work / "node" / "runc-state"
    if ctx.kit is None or not state.exists():
        return []
    env = {**os.environ, "LD_LIBRARY_PATH": str(ctx.kit.runc_libs)}
    code, text = host.run_text([str(ctx.kit.runc), "--root", str(state), "list", "--quiet"], env=env)
    return text.split() if code == 0 else [f"(runc list failed: {text.strip()[-200:]})"]
