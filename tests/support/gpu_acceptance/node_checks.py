"""The checks of one driver instance with NVIDIA's hook (registration, slices, health, a whole GPU prepared and run
in a container, usage metrics, unprepare, timings, time-slicing). Runs inside the kit's venv."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from dradriver.validation.slices import validate_pool
from support.gpu_acceptance import host
from support.gpu_acceptance.container import ContainerRun, Runtime
from support.gpu_acceptance.node import Node, attribute
from support.gpu_acceptance.report import CheckResult, failed, judged, passed, skipped
from support.gpu_acceptance.session import Recorder, SessionConfig, eventually, http_get
from support.slice_rules import slice_errors

HEALTHY = 1
ALL_WORKLOADS = ["env", "where", "nvidia-smi", "cuda", "opencl", "egl"]
USAGE_FAMILIES = {
    "utilization": "dradriver_device_utilization_ratio",
    "memoryUsed": "dradriver_device_memory_used_bytes",
    "memoryTotal": "dradriver_device_memory_total_bytes",
    "temperature": "dradriver_device_temperature_celsius",
    "power": "dradriver_device_power_watts",
    "eccUncorrected": "dradriver_device_ecc_uncorrected_errors",
    "processes": "dradriver_device_processes",
}
MARKERS = {"cuda": "CUDA_PTX_OK", "opencl": "OPENCL_OK", "egl": "EGL_OK"}
#: Where each probe's driver-side files must land for the image's loader to find them.
PROBE_FILES = {"opencl": "/etc/OpenCL/vendors", "egl": "/usr/share/glvnd/egl_vendor.d"}


def check_registration(node: Node) -> CheckResult:
    plugin = node.register()
    return passed(
        "run-registration",
        f"registered as {plugin.info.name} over {plugin.version} (health: {plugin.health_version or 'none'})",
        endpoint=plugin.info.endpoint,
        versions=list(plugin.info.supported_versions),
    )


def check_slices(node: Node) -> CheckResult:
    slices = node.published()
    problems = [f"{s['metadata']['name']}: {e}" for s in slices for e in slice_errors(s, minor=35)]
    problems += [f"pool: {p}" for p in validate_pool(slices)]
    gpus = node.gpus()
    seen = {attribute(d, "uuid"): attribute(d, "productName") for d in gpus}
    if node.cfg.real:
        expected = {g["uuid"]: g.get("name", "") for g in node.cfg.smi_gpus}
        if set(seen) != set(expected):
            problems.append(f"GPU UUIDs published {sorted(seen)} but nvidia-smi lists {sorted(expected)}")
        problems += [
            f"{u}: productName {seen[u]!r}, nvidia-smi {n!r}" for u, n in expected.items() if seen.get(u, n) != n
        ]
    if not gpus:
        problems.append("no whole-GPU device published")
    summary = [{"name": d["name"], "uuid": attribute(d, "uuid"), "capacity": d.get("capacity")} for d in gpus]
    return judged("run-slices", problems, f"{len(slices)} slice(s), {len(gpus)} GPU(s), valid", devices=summary)


def check_health(node: Node) -> CheckResult:
    assert node.plugin is not None
    stream = node.plugin.watch_health(timeout=20)
    try:
        first = next(iter(stream))
    finally:
        stream.cancel()
    health = {d.device.device_name: int(d.health) for d in first.devices}
    names = [d["name"] for d in node.gpus()]
    problems = [f"{n}: not in the stream" for n in names if n not in health]
    problems += [f"{n}: health {h}" for n, h in health.items() if h != HEALTHY]
    return judged("run-health", problems, f"HEALTHY: {', '.join(sorted(health))}", health=health)


def spec_summary(path: Path) -> dict[str, Any]:
    spec = json.loads(path.read_text())
    edits = spec.get("containerEdits") or {}
    return {
        "kind": spec.get("kind"),
        "devices": [d.get("name") for d in spec.get("devices", [])],
        "deviceNodes": [
            n.get("path") for d in spec.get("devices", []) for n in d["containerEdits"].get("deviceNodes", [])
        ],
        "env": edits.get("env", []),
        "mounts": len(edits.get("mounts", [])),
        "hooks": [" ".join(h.get("args", [])[1:3]) for h in edits.get("hooks", [])],
    }


def check_prepare(node: Node, held: dict[str, Any]) -> CheckResult:
    """Allocate and prepare a whole GPU; ``held`` gets the claim, its CDI ids and its GPU's UUID."""
    claim = held["claim"] = node.claim("acceptance-whole")
    started = time.monotonic()
    result = node.prepare(claim)
    took = time.monotonic() - started
    if result.error:
        return failed("prepare-whole-gpu", f"prepare: {result.error}")
    [device] = result.devices
    held["cdi_ids"] = list(device["cdi_device_ids"])
    held["gpu_uuid"] = next(attribute(d, "uuid") for d in node.gpus() if d["name"] == device["device_name"])
    spec = node.dirs.spec(claim.uid)
    if not spec.exists():
        return failed("prepare-whole-gpu", f"prepared, but no CDI spec at {spec}", device=device)

    def status_devices() -> list[Any]:
        stored = node.api.get("resourceclaims", claim.name, "default") or {}
        return list(stored.get("status", {}).get("devices", []))

    return passed(
        "prepare-whole-gpu",
        f"prepared {device['device_name']} in {took * 1000:.0f} ms; spec {spec.name}",
        device=device,
        spec=spec_summary(spec),
        statusDevices=eventually(status_devices, 10),
    )


def _section(run: ContainerRun, workload: str) -> str:
    found = run.workloads.get(workload)
    return "(no output)" if found is None else f"exit {found.rc}: {found.output.strip()[-700:]}"


def judge_smi(run: ContainerRun, name: str, gpu_uuid: str) -> CheckResult:
    smi = run.workloads.get("nvidia-smi")
    where = run.workloads.get("where")
    details = {"where": where.values if where else {}, "output": _section(run, "nvidia-smi")}
    if smi is not None and smi.rc == 0 and gpu_uuid in smi.output:
        return passed(name, smi.output.strip().splitlines()[0], **details)
    return failed(name, f"nvidia-smi -L: {_section(run, 'nvidia-smi')}", **details)


def probe_held(workload: str, rc: int, output: str) -> bool:
    """A workload's own success: its marker, and for OpenCL and EGL NVIDIA's implementation answering (not
    another vendor's, as Mesa's EGL on a machine without the driver's)."""
    return rc == 0 and MARKERS[workload] in output and (workload == "cuda" or "NVIDIA" in output)


def judge_probe(run: ContainerRun, name: str, workload: str, host_problem: str) -> CheckResult:
    """A workload's section: passed on its marker; a probe that failed on the host too does not apply."""
    if host_problem:
        return skipped(name, f"does not apply: {host_problem}")
    found = run.workloads.get(workload)
    details: dict[str, Any] = {"values": found.values if found else {}}
    if found is not None and probe_held(workload, found.rc, found.output):
        first = (
            found.values.get("device_name") or found.values.get("platform0_device0_name") or found.values.get("vendor")
        )
        return passed(name, f"{MARKERS[workload]} ({first or 'no name'})", **details)
    hint = ""
    if workload in PROBE_FILES:
        mounted = [m for m in run.edits.get("mounts", []) if PROBE_FILES[workload] in m]
        hint = f"; spec mounts into {PROBE_FILES[workload]}: {mounted or 'nothing'}"
    return failed(name, f"{workload}: {_section(run, workload)}{hint}", **details)


def judge_container(run: ContainerRun, mode: str, cfg: SessionConfig, gpu_uuid: str) -> list[CheckResult]:
    """The four container checks of one run (``mode``: hook or nohook)."""
    names = {w: f"container-{mode}-{w}" for w in ("nvidia-smi", "cuda", "opencl", "egl")}
    if run.error:
        return [failed(n, f"no container: {run.error}", edits=run.edits) for n in names.values()]
    results = [judge_smi(run, names["nvidia-smi"], gpu_uuid)]
    results += [judge_probe(run, names[w], w, "" if w == "cuda" else cfg.host_probes.get(w, "")) for w in MARKERS]
    results[0].seconds = round(run.seconds, 2)
    results[0].details.update(containerSeconds=round(run.seconds, 2), edits=run.edits, env=_section(run, "env"))
    return results


def check_usage_metrics(node: Node, claim_name: str, gpu_uuid: str) -> CheckResult:
    port = node.driver.metrics_port
    if port is None:
        return failed("usage-metrics", "the driver logged no metrics port")
    label = f'uuid="{gpu_uuid}"'

    def scrape() -> str:
        text = http_get(port, "/metrics")[1]
        return text if f"{USAGE_FAMILIES['memoryUsed']}{{" in text and claim_name in text else ""

    lines = (eventually(scrape, 15, 0.5) or http_get(port, "/metrics")[1]).splitlines()
    present = {k: any(x.startswith(f + "{") and label in x for x in lines) for k, f in USAGE_FAMILIES.items()}
    allocation = [x for x in lines if x.startswith("dradriver_device_allocation_info{") and claim_name in x]
    problems = [
        f"no {USAGE_FAMILIES[k]} series for {gpu_uuid}" for k in ("memoryUsed", "memoryTotal") if not present[k]
    ]
    if not allocation:
        problems.append(f"no dradriver_device_allocation_info series for claim {claim_name}")
    absent = [k for k, there in present.items() if not there]
    allocations = http_get(port, "/allocations")[1]
    return judged(
        "usage-metrics",
        problems,
        f"usage series for {gpu_uuid}; not reported (NOT_SUPPORTED): {', '.join(absent) or 'none'}",
        notSupported=absent,
        allocationSeries=allocation,
        allocationsHasClaim=claim_name in allocations,
    )


def check_unprepare(node: Node, held: dict[str, Any]) -> CheckResult:
    claim = held["claim"]
    error = node.unprepare(claim)
    node.forget(claim)
    problems = [f"unprepare: {error}"] if error else []
    if node.dirs.spec(claim.uid).exists():
        problems.append(f"{node.dirs.spec(claim.uid)} is still there")
    return judged("unprepare-whole-gpu", problems, "unprepared; its CDI spec is gone")


def container_checks(node: Node, rec: Recorder, runtime: Runtime, held: dict[str, Any]) -> None:
    """The prepared claim's container with the hook: the workloads, then a bare start for its time."""
    if rec.out_of_time():
        rec.skip([f"container-hook-{w}" for w in ("nvidia-smi", "cuda", "opencl", "egl")], "out of time")
        return
    run = runtime.run("hook", node.dirs.cdi, held["cdi_ids"], ALL_WORKLOADS)
    for result in judge_container(run, "hook", node.cfg, held["gpu_uuid"]):
        rec.add(result)
    rec.note(
        "containerStartSecondsHook",
        round(runtime.run("hook-true", node.dirs.cdi, held["cdi_ids"], ["true"]).seconds, 3),
    )


def whole_gpu_checks(node: Node, rec: Recorder, runtime: Runtime) -> None:
    """Prepare a whole GPU, run the container with the hook, read the metrics, unprepare."""
    held: dict[str, Any] = {}
    dependent = [f"container-hook-{w}" for w in ("nvidia-smi", "cuda", "opencl", "egl")] + ["usage-metrics"]
    if rec.timed("prepare-whole-gpu", lambda: check_prepare(node, held)).status != "pass":
        rec.skip(dependent, "prepare-whole-gpu failed")
    else:
        # Whatever breaks in the container runs, the claim is still unprepared below.
        rec.guarded(dependent[:-1], lambda: container_checks(node, rec, runtime, held))
        rec.timed("usage-metrics", lambda: check_usage_metrics(node, held["claim"].name, held["gpu_uuid"]))
    if "claim" in held:
        rec.timed("unprepare-whole-gpu", lambda: check_unprepare(node, held))
    else:
        rec.skip(["unprepare-whole-gpu"], "no claim was allocated")


def check_timings(node: Node, rec: Recorder, cycles: int = 10) -> CheckResult:
    """``cycles`` prepares and unprepares of one whole-GPU claim; p50 and p90 of each."""
    claim = node.claim("acceptance-timing")
    prepares, unprepares = [], []
    try:
        for _ in range(cycles):
            started = time.monotonic()
            result = node.prepare(claim)
            prepares.append(time.monotonic() - started)
            if result.error:
                return failed("prepare-timings", f"prepare: {result.error}")
            started = time.monotonic()
            error = node.unprepare(claim)
            unprepares.append(time.monotonic() - started)
            if error:
                return failed("prepare-timings", f"unprepare: {error}")
    finally:
        node.forget(claim)
    figures = {
        "prepareP50Ms": round(statistics.median(prepares) * 1000, 1),
        "prepareP90Ms": round(statistics.quantiles(prepares, n=10)[-1] * 1000, 1),
        "unprepareP50Ms": round(statistics.median(unprepares) * 1000, 1),
        "containerStartSecondsHook": rec.notes.get("containerStartSecondsHook"),
    }
    return passed(
        "prepare-timings",
        f"prepare p50 {figures['prepareP50Ms']} ms (p90 {figures['prepareP90Ms']}), unprepare p50 "
        f"{figures['unprepareP50Ms']} ms over {cycles} cycles; container start with the hook "
        f"{figures['containerStartSecondsHook']} s",
        **figures,
    )


def compute_policy(cfg: SessionConfig, gpu_uuid: str) -> str:
    """What ``nvidia-smi compute-policy -l`` says of the GPU (no public getter of the time-slice exists)."""
    if not cfg.real:
        return "simulated node: not read"
    try:
        smi = host.find_tool("nvidia-smi") or "nvidia-smi"
        done = subprocess.run(
            [smi, "compute-policy", "-l", "-i", gpu_uuid], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"cannot read back: {err}"
    text = (done.stdout + done.stderr).strip()
    return text[-400:] if done.returncode == 0 else f"cannot read back (exit {done.returncode}): {text[-300:]}"


def check_time_slicing(node: Node) -> CheckResult:
    gpu_uuid = str(attribute(node.gpus()[0], "uuid"))
    found = node.cfg.found_modes.get(gpu_uuid, {}).get("computeMode", "unknown")
    if node.cfg.real and found != "Default":
        return skipped(
            "time-slicing", f"{gpu_uuid} runs in compute mode {found}; time-slicing sets Default, never done here"
        )
    config = {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}
    claim = node.claim("acceptance-timeslice", config=config)
    before = compute_policy(node.cfg, gpu_uuid)
    try:
        result = node.prepare(claim)
        during = compute_policy(node.cfg, gpu_uuid)
        error = node.unprepare(claim)
    finally:
        node.forget(claim)
    after = compute_policy(node.cfg, gpu_uuid)
    problems = [f"prepare: {result.error}"] if result.error else []
    problems += [f"unprepare: {error}"] if error else []
    # Unprepare resets the time-slice to Default (none can be read back through NVML): on a GPU found at another
    # time-slice that is a change to the machine, said here.
    if node.cfg.real and not before.startswith("cannot") and after != before:
        problems.append(f"the compute policy is not as found: before {before!r}, after {after!r}")
    return judged(
        "time-slicing",
        problems,
        "time-slice Long set at prepare and reset at unprepare",
        policyBefore=before,
        policyDuring=during,
        policyAfter=after,
    )


def phase_with_hook(cfg: SessionConfig, rec: Recorder, api: Any, runtime: Runtime) -> None:
    """The first driver instance, its specs naming NVIDIA's hook from the kit."""
    node, problem = Node.start(cfg, api, "a", ["--nvidia-cdi-hook-path", str(runtime.kit.hook)])
    try:
        if problem:
            rec.fail(["run-registration"], problem)
            return
        if rec.timed("run-registration", lambda: check_registration(node)).status != "pass":
            return
        rec.timed("run-slices", lambda: check_slices(node))
        rec.timed("run-health", lambda: check_health(node))
        whole_gpu_checks(node, rec, runtime)
        rec.timed("prepare-timings", lambda: check_timings(node, rec))
        rec.timed("time-slicing", lambda: check_time_slicing(node))
    finally:
        rec.note("driverExitHook", node.close())
