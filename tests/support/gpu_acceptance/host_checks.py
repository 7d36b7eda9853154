"""The checks that need no driver instance: the real-NVML contract tests, doctor, inventory against nvidia-smi,
usage from NVML, the workloads on the host; and, last, that the GPU was left as found. They run from the outer kit
(standard library only) and start the kit's venv interpreter for anything that needs dradriver."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.gpu_acceptance import host
from support.gpu_acceptance.kit import Unpacked
from support.gpu_acceptance.report import CheckResult, failed, judged, passed, skipped

MIB = 1024 * 1024
#: What lets tests/gpu change a GPU's MIG or compute mode (never on a lent machine: others share it).
MAY_CHANGE_GPUS = "DRADRIVER_GPU_TESTS_MAY_CHANGE_GPUS"


@dataclass
class Context:
    """What every check of one run shares: where things are, the interpreter with dradriver, the deadline, and
    what was found on the host before anything ran."""

    repo: Path
    work: Path
    out: Path
    python: str
    deadline: float  # time.monotonic() by which everything must be done
    rehearse: bool = False
    kit: Unpacked | None = None
    smi: list[dict[str, str]] = field(default_factory=list)
    found: dict[str, dict[str, str]] = field(default_factory=dict)
    host_probes: dict[str, str] = field(default_factory=dict)
    #: What the checks' interpreter imports from the checkout: the test support always, and ``src`` unless
    #: dradriver comes from the kit's wheel.
    paths: tuple[str, ...] = ("tests", "src")

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def env(self) -> dict[str, str]:
        """The checks' environment: this one, the checkout on PYTHONPATH, NVIDIA's tools on PATH (the lent machines
        keep them in /usr/local/nvidia/bin, on no PATH: MPS's control daemon starts its server from PATH), and never
        the contract tests' permission to change a GPU's modes."""
        pythonpath = os.pathsep.join(str(self.repo / p) for p in self.paths)
        path = os.environ.get("PATH", "")
        tools = {os.path.dirname(t) for t in map(host.find_tool, ("nvidia-smi", "nvidia-cuda-mps-control")) if t}
        path = os.pathsep.join([*sorted(tools - set(path.split(os.pathsep))), path])
        env = {k: v for k, v in os.environ.items() if k != MAY_CHANGE_GPUS}
        return {**env, "PATH": path, "PYTHONPATH": pythonpath, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1"}

    def python_run(self, args: list[str], timeout: float) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of the check interpreter run with ``args`` in the checkout."""
        try:
            done = subprocess.run(
                [self.python, *args],
                capture_output=True,
                text=True,
                timeout=max(1.0, min(timeout, self.remaining())),
                check=False,
                cwd=self.repo,
                env=self.env(),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return 124, "", f"timed out after {timeout:.0f} s"
        return done.returncode, done.stdout, done.stderr


def junit_counts(path: Path) -> dict[str, Any]:
    """Totals and the failed and skipped tests (with their messages) of a JUnit XML file."""
    root = ET.parse(path).getroot()
    inner = root.find("testsuite")
    suite = inner if root.tag != "testsuite" and inner is not None else root
    counts: dict[str, Any] = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    counts["failed"], counts["skippedTests"] = {}, {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag, key in (("failure", "failed"), ("error", "failed"), ("skipped", "skippedTests")):
            found = case.find(tag)
            if found is not None:
                counts[key][name] = (found.get("message") or found.text or "")[:300]
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def check_nvml_contract(ctx: Context) -> CheckResult:
    junit = ctx.work / "pytest-gpu.xml"
    args = ["-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "--confcutdir", "tests", "-m", "gpu"]
    rc, out, err = ctx.python_run([*args, "-rA", "-q", f"--junitxml={junit}", "tests/gpu"], timeout=240)
    (ctx.out / "pytest-gpu.txt").write_text(out + err)
    if not junit.exists():
        return failed("nvml-contract", f"pytest exited {rc} without a report: {(out + err).strip()[-600:]}")
    counts = junit_counts(junit)
    if counts["failed"]:
        return failed("nvml-contract", f"{len(counts['failed'])} failed: {sorted(counts['failed'])}", **counts)
    if counts["passed"] == 0:
        why = next(iter(counts["skippedTests"].values()), f"pytest exited {rc}")
        if ctx.rehearse:
            return skipped("nvml-contract", f"rehearsal: no real NVML ({why})", **counts)
        return failed("nvml-contract", f"no real-NVML test ran: {why}", **counts)
    return passed(
        "nvml-contract",
        f"{counts['passed']} passed, {counts['skipped']} skipped (those that change MIG or compute modes, or need "
        "the simulator's faults)",
        **counts,
    )


def check_doctor(ctx: Context) -> CheckResult:
    dirs = {name: ctx.work / "doctor" / name for name in ("cdi", "plugin", "registry")}
    for folder in dirs.values():
        folder.mkdir(parents=True, exist_ok=True)
    args = ["-m", "dradriver", "doctor", "-o", "json", "--cdi-hook-source", "none"]
    args += [f"--{name}-dir={path}" for name, path in dirs.items()]
    if ctx.kit is not None:
        args += ["--nvidia-cdi-hook-path", str(ctx.kit.hook)]
    args += ["--gpu-backend", "sim"] if ctx.rehearse else ["--driver-root", "/"]
    rc, out, err = ctx.python_run(args, timeout=60)
    try:
        checks = json.loads(out)["checks"]
    except (ValueError, KeyError):
        return failed("doctor", f"doctor exited {rc}: {(out + err).strip()[-600:]}")
    problems = [f"{c['name']}: {c['detail']} ({c['fix']})" for c in checks if c["status"] == "FAIL"]
    if rc != 0 and not problems:
        problems.append(f"doctor exited {rc}")
    warnings = [f"{c['name']}: {c['detail']}" for c in checks if c["status"] == "WARN"]
    oks = sum(c["status"] == "OK" for c in checks)
    return judged("doctor", problems, f"{oks} OK, no failure; warnings: {warnings or 'none'}", checks=checks)


def mig_profile_names(index: str) -> list[str]:
    """The GPU-instance profiles nvidia-smi lists for a GPU with MIG on."""
    code, text = host.run_text([host.find_tool("nvidia-smi") or "nvidia-smi", "mig", "-lgip", "-i", index])
    return sorted(set(re.findall(r"MIG\s+(\d+g\.\d+gb(?:\+\w+)?)", text))) if code == 0 else []


def inventory_problems(inventory: dict[str, Any], smi: list[dict[str, str]]) -> list[str]:
    """Where dradriver inventory and nvidia-smi disagree on a GPU's identity, memory, modes or MIG profiles."""
    gpus = {g["uuid"]: g for g in inventory.get("gpus", [])}
    problems = []
    for row in smi:
        gpu = gpus.get(row["uuid"])
        if gpu is None:
            problems.append(f"{row['uuid']}: in nvidia-smi, not in the inventory")
            continue
        pairs = [
            ("productName", gpu.get("productName"), row.get("name")),
            ("pciBusId", gpu.get("pciBusId"), host.normalize_bus_id(row.get("pci.bus_id", ""))),
            ("memory MiB", str(gpu.get("memoryBytes", 0) // MIB), row.get("memory.total")),
            ("driverVersion", inventory.get("driverVersion"), row.get("driver_version")),
        ]
        if "compute_cap" in row:
            pairs.append(("cudaComputeCapability", gpu.get("cudaComputeCapability"), row["compute_cap"]))
        if row.get("mig.mode.current") in ("Enabled", "Disabled"):
            pairs.append(("migEnabled", str(gpu.get("migEnabled")), str(row["mig.mode.current"] == "Enabled")))
        if gpu.get("migEnabled"):
            ours = sorted(p["name"] for p in gpu.get("migProfiles", []))
            pairs.append(("MIG profiles", str(ours), str(mig_profile_names(row["index"]))))
        problems += [f"{row['uuid']} {what}: inventory {a!r}, nvidia-smi {b!r}" for what, a, b in pairs if a != b]
    extra = set(gpus) - {row["uuid"] for row in smi}
    return problems + [f"{u}: in the inventory, not in nvidia-smi" for u in sorted(extra)]


def check_inventory(ctx: Context) -> CheckResult:
    if ctx.rehearse:
        return skipped("inventory-vs-nvidia-smi", "rehearsal: no nvidia-smi")
    rc, out, err = ctx.python_run(["-m", "dradriver", "inventory", "-o", "json"], timeout=60)
    try:
        inventory = json.loads(out)
    except ValueError:
        return failed("inventory-vs-nvidia-smi", f"inventory exited {rc}: {(out + err).strip()[-600:]}")
    problems = inventory_problems(inventory, ctx.smi)
    mig_on = [g["uuid"] for g in inventory.get("gpus", []) if g.get("migEnabled")]
    profiles = "compared" if mig_on else "not compared: MIG is off (nvidia-smi lists profiles only with MIG on)"
    return judged(
        "inventory-vs-nvidia-smi",
        problems,
        f"{len(ctx.smi)} GPU(s) agree on identity, bus ID, memory, driver, compute capability; MIG profiles {profiles}",
        inventory=inventory,
        nvidiaSmi=ctx.smi,
    )


USAGE_PROBE = (
    "import dataclasses, json\n"
    "from dradriver.gpu.nvml import NvmlGpuLib\n"
    "lib = NvmlGpuLib()\n"
    "print(json.dumps([dataclasses.asdict(lib.usage(g.uuid)) for g in lib.gpus()], default=str))\n"
    "lib.close()\n"
)


# The passthrough unbind's precondition on real hardware: inside ``released()`` this process holds no GPU device
# node (the nvidia driver's unbind would wait for it), and afterwards NVML counts the same GPUs and watches events.
RELEASE_PROBE = (
    "import json, os\n"
    "from dradriver.gpu.nvml import NvmlGpuLib\n"
    "def held():\n"
    "    found = []\n"
    "    for fd in os.listdir('/proc/self/fd'):\n"
    "        try:\n"
    "            target = os.readlink(f'/proc/self/fd/{fd}')\n"
    "        except OSError:\n"
    "            continue\n"
    "        if target.startswith(('/dev/nvidia', '/dev/dri/')):\n"
    "            found.append(target)\n"
    "    return sorted(found)\n"
    "lib = NvmlGpuLib()\n"
    "before = [g.uuid for g in lib.gpus()]\n"
    "lib.wait_for_event(0.01)  # the health event set (registered by gpus()) answers: it holds the GPUs too\n"
    "open_before = held()\n"
    "with lib.released():\n"
    "    open_during = held()\n"
    "after = [g.uuid for g in lib.gpus()]\n"
    "lib.wait_for_event(0.01)\n"
    "open_after = held()\n"
    "lib.close()\n"
    "print(json.dumps({'before': before, 'after': after, 'openBefore': open_before, 'openDuring': open_during,\n"
    "                  'openAfter': open_after}))\n"
)


def release_problems(probe: dict[str, Any]) -> list[str]:
    """What the release probe's answer shows wrong: a GPU device node still open inside ``released()``, or GPUs
    counted differently afterwards."""
    problems = []
    gpu_nodes = [n for n in probe["openDuring"] if re.fullmatch(r"/dev/nvidia\d+|/dev/dri/.+", n)]
    if gpu_nodes:
        problems.append(f"still open while NVML is let go: {', '.join(gpu_nodes)} (an unbind would wait for them)")
    if sorted(probe["before"]) != sorted(probe["after"]):
        problems.append(f"GPUs before the release {probe['before']}, after it {probe['after']}")
    if not any(re.fullmatch(r"/dev/nvidia\d+", n) for n in probe["openBefore"]):
        problems.append("no /dev/nvidiaN open before the release: the probe shows nothing (NVML attaches lazily?)")
    return problems


def check_nvml_release(ctx: Context) -> CheckResult:
    if ctx.rehearse:
        return skipped("nvml-release", "rehearsal: no real NVML")
    rc, out, err = ctx.python_run(["-c", RELEASE_PROBE], timeout=60)
    try:
        probe = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return failed("nvml-release", f"the release probe exited {rc}: {(out + err).strip()[-600:]}")
    left = ", ".join(probe["openDuring"]) or "nothing"
    return judged("nvml-release", release_problems(probe), f"open while let go: {left}; GPUs counted again", **probe)


def check_usage_nvml(ctx: Context) -> CheckResult:
    if ctx.rehearse:
        return skipped("usage-nvml", "rehearsal: no real NVML")
    rc, out, err = ctx.python_run(["-c", USAGE_PROBE], timeout=60)
    try:
        usages = json.loads(out.strip().splitlines()[-1])  # a library that prints on its own cannot spoil it
    except (ValueError, IndexError):
        return failed("usage-nvml", f"reading usage exited {rc}: {(out + err).strip()[-600:]}")
    missing = {u["uuid"]: [k for k, v in u.items() if v is None] for u in usages}
    problems = [f"{u}: memory not reported" for u, keys in missing.items() if "memory_used_bytes" in keys]
    summary = "; ".join(f"{u}: {', '.join(keys) or 'nothing'}" for u, keys in missing.items())
    return judged("usage-nvml", problems, f"NOT_SUPPORTED: {summary}", usage=usages, notSupported=missing)
