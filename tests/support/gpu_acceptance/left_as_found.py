"""The last check: the GPU and the host as they were found. Compute and MIG modes per GPU (read again with
nvidia-smi), no MPS daemon or server, no CDI spec, container or mount of ours left, every driver instance ended
cleanly at SIGTERM."""

from __future__ import annotations

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
    specs = sorted(str(p) for p in ctx.work.glob("*/cdi/*.json"))
    problems += [f"CDI spec left: {s}" for s in specs]
    problems += [f"mount left: {m}" for m in host.mounts_under(ctx.work)]
    problems += [f"container left: {c}" for c in notes.get("containersLeft") or []]
    for key in ("driverExitHook", "driverExitNoHook"):
        if key in notes and notes[key] != 0:
            problems.append(f"{key}: dradriver run exited {notes[key]} at SIGTERM")
    modes = ", ".join(f"{u}: {m['computeMode']}, MIG {m['migMode']}" for u, m in ctx.found.items()) or "simulated node"
    return judged("left-as-found", problems, f"as found ({modes}); nothing of ours left", found=ctx.found, now=now)
