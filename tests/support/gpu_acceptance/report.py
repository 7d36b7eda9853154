"""The acceptance report: one result per check of :data:`CHECKS`, written as JSON and as a readable summary.

Exit statuses (docs/development.md): 0 every check that applies held; 1 a check failed; 2 the kit could not run (a
bad flag, no prepared kit where a GPU needs one); 3 no GPU here, so every check was skipped and nothing was proven.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"
EXIT_HELD, EXIT_FAILED, EXIT_UNUSABLE, EXIT_NO_GPU = 0, 1, 2, 3
REPORT_VERSION = 1

#: Every check, in the order the kit runs them: (name, what it proves).
CHECKS: tuple[tuple[str, str], ...] = (
    ("nvml-contract", "the GpuLib contract tests (tests/gpu, marker gpu) against the real NVML"),
    ("doctor", "dradriver doctor against this host: no check fails"),
    ("inventory-vs-nvidia-smi", "dradriver inventory agrees with nvidia-smi: identity, memory, MIG profiles"),
    ("usage-nvml", "usage read from the real NVML; what answers NOT_SUPPORTED recorded"),
    ("nvml-release", "NVML let go as before a passthrough unbind: no /dev/nvidiaN open, the same GPUs after"),
    ("workloads-on-host", "the CUDA PTX program, OpenCL and EGL probes on the host itself (the baseline)"),
    ("run-registration", "dradriver run --gpu-backend nvml --driver-root / registers with a kubelet-like client"),
    ("run-slices", "the ResourceSlices it publishes: valid, one device per GPU, attributes as nvidia-smi says"),
    ("run-health", "the kubelet health stream says HEALTHY for every GPU"),
    ("prepare-whole-gpu", "NodePrepareResources of a whole GPU: CDI spec written, status data"),
    ("container-hook-nvidia-smi", "with NVIDIA's hook: nvidia-smi -L in a bare glibc container from our spec"),
    ("container-hook-cuda", "with NVIDIA's hook: the CUDA driver-API program JIT-loads its PTX and checks it"),
    ("container-hook-opencl", "with NVIDIA's hook: OpenCL sees the GPU (where the driver ships OpenCL)"),
    ("container-hook-egl", "with NVIDIA's hook: EGL device platform initialises (where the driver ships EGL)"),
    ("usage-metrics", "/metrics usage series from real NVML and the allocation series of the prepared claim"),
    ("unprepare-whole-gpu", "NodeUnprepareResources: the claim's CDI spec gone"),
    ("prepare-timings", "prepare and unprepare p50 on real NVML, container start time"),
    ("time-slicing", "a TimeSlicing claim: the time-slice set, read back, reset at unprepare"),
    ("container-nohook-nvidia-smi", "without a hook: nvidia-smi -L in the bare glibc container"),
    ("container-nohook-cuda", "without a hook: the CUDA PTX program"),
    ("container-nohook-opencl", "without a hook: the OpenCL probe"),
    ("container-nohook-egl", "without a hook: the EGL probe"),
    ("mps", "MPS for a claim: its daemon, a CUDA client in the container through pipe and /dev/shm, the limits"),
    ("mps-unprepare", "unprepare of the MPS claim: daemon and server stopped, directories and tmpfs gone"),
    ("left-as-found", "after everything: compute mode and MIG mode as found, no daemon, no spec, no container"),
)
CHECK_NAMES = tuple(name for name, _ in CHECKS)


@dataclass
class CheckResult:
    """One check's outcome: ``reason`` says why it failed or could not apply (or, passing, what held)."""

    name: str
    status: str
    reason: str
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return dict(CHECKS).get(self.name, "")


def passed(name: str, reason: str, **details: Any) -> CheckResult:
    return CheckResult(name, PASS, reason, details=details)


def failed(name: str, reason: str, **details: Any) -> CheckResult:
    return CheckResult(name, FAIL, reason, details=details)


def skipped(name: str, reason: str, **details: Any) -> CheckResult:
    return CheckResult(name, SKIP, reason, details=details)


def judged(name: str, problems: list[str], held: str, **details: Any) -> CheckResult:
    """Passed with ``held`` when there are no ``problems``, else failed naming them all."""
    if problems:
        return failed(name, "; ".join(problems), **details)
    return passed(name, held, **details)


@dataclass
class Report:
    """The results gathered so far, with what is known of the host."""

    started: float = field(default_factory=time.time)
    host: dict[str, Any] = field(default_factory=dict)
    results: dict[str, CheckResult] = field(default_factory=dict)
    rehearsal: bool = False
    #: Where ``report.json`` is rewritten after each result (marked partial), so a run killed from outside still
    #: leaves what it had found; None: only at the end.
    out: Path | None = None

    def add(self, result: CheckResult) -> None:
        self.results[result.name] = result
        if self.out is not None:
            with contextlib.suppress(OSError):  # the final write says so, if it fails too
                write_json({**self.document(), "partial": True}, self.out)

    def pending(self) -> list[str]:
        return [name for name in CHECK_NAMES if name not in self.results]

    def skip_rest(self, reason: str) -> None:
        """Every check without a result yet is skipped for ``reason``."""
        for name in self.pending():
            self.add(skipped(name, reason))

    def exit_status(self, results: list[CheckResult]) -> int:
        statuses = [r.status for r in results]
        if FAIL in statuses:
            return EXIT_FAILED
        if not self.host.get("gpu") and PASS not in statuses:
            return EXIT_NO_GPU
        return EXIT_HELD

    def document(self) -> dict[str, Any]:
        """The JSON report: the host, every check in catalogue order (one without a result: not reached), the
        counts and the exit status."""
        ordered = [self.results.get(name) or skipped(name, "not reached") for name in CHECK_NAMES]
        counts = {status: sum(r.status == status for r in ordered) for status in (PASS, FAIL, SKIP)}
        return {
            "tool": "gpu-acceptance",
            "version": REPORT_VERSION,
            "rehearsal": self.rehearsal,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wallSeconds": round(time.time() - self.started, 1),
            "host": {"machine": platform.machine(), "python": platform.python_version(), **self.host},
            "checks": [{"title": r.title, **asdict(r)} for r in ordered],
            "counts": counts,
            "exitStatus": self.exit_status(ordered),
        }


def summary(document: dict[str, Any]) -> str:
    """The readable form of a report document: one line a check, then the counts and what the exit status means."""
    host = document["host"]
    lines = [
        f"gpu-acceptance{' (rehearsal on the simulated node)' if document['rehearsal'] else ''}: "
        f"{document['wallSeconds']} s, driver {host.get('driverVersion') or '-'}, "
        f"GPUs: {', '.join(host.get('gpuNames') or []) or 'none'}"
    ]
    for check in document["checks"]:
        lines.append(f"{check['status'].upper():4}  {check['name']:28} {check['seconds']:6.1f} s  {check['reason']}")
    counts = document["counts"]
    meaning = {
        EXIT_HELD: "every check that applies held",
        EXIT_FAILED: "a check failed",
        EXIT_UNUSABLE: "the kit could not run",
        EXIT_NO_GPU: "no GPU here: nothing was proven",
    }.get(document["exitStatus"], "")
    lines.append(
        f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped; exit {document['exitStatus']}: "
        f"{meaning}"
    )
    return "\n".join(lines) + "\n"


def write_json(document: dict[str, Any], out: Path) -> Path:
    """Write ``report.json`` into ``out`` whole or not at all (a run killed mid-write keeps the last one)."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.json"
    partial = out / ".report.json.partial"
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(report)
    return report


def write(document: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``summary.txt`` into ``out``; return their paths."""
    report = write_json(document, out)
    text = out / "summary.txt"
    text.write_text(summary(document))
    return report, text
