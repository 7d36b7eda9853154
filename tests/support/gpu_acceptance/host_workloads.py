"""The workloads on the host itself, before any container: the baseline that says whether a failure in the
container is the container's. OpenCL and EGL get the kit's loaders (the part an application image brings) and, where
the host keeps NVIDIA's ICD or vendor file outside the loaders' default places, are pointed at them, and that is
recorded: a container gets only what the CDI spec puts in the default places."""

from __future__ import annotations

import os
from pathlib import Path

from support.gpu_acceptance import host
from support.gpu_acceptance.host_checks import Context
from support.gpu_acceptance.report import CheckResult, failed, passed

#: The driver's own library each probe needs, and the marker its program prints on success.
PROBES = {
    "cuda-ptx": ("libcuda.so.1", "CUDA_PTX_OK"),
    "opencl-probe": ("libnvidia-opencl.so.1", "OPENCL_OK"),
    "egl-probe": ("libEGL_nvidia.so.0", "EGL_OK"),
}
EGL_VENDOR_DIRS = ("/etc/glvnd/egl_vendor.d", "/usr/share/glvnd/egl_vendor.d")
EGL_VENDOR_ELSEWHERE = ("/usr/local/nvidia/share/glvnd/egl_vendor.d", "/usr/local/share/glvnd/egl_vendor.d")


def probe_env(ctx: Context, kit_loaders: Path) -> tuple[dict[str, str], list[str]]:
    """The environment for the host's OpenCL and EGL probes, and what had to be pointed out to the loaders."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(kit_loaders)}
    helped = []
    vendors = Path("/etc/OpenCL/vendors")
    if not (vendors.is_dir() and any(vendors.glob("*.icd"))):
        icd = ctx.work / "icd"
        icd.mkdir(parents=True, exist_ok=True)
        (icd / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
        env["OCL_ICD_VENDORS"] = str(icd)
        helped.append("no /etc/OpenCL/vendors/*.icd on the host: OCL_ICD_VENDORS names libnvidia-opencl.so.1")
    if not any(Path(d, "10_nvidia.json").exists() for d in EGL_VENDOR_DIRS):
        found = next((f"{d}/10_nvidia.json" for d in EGL_VENDOR_ELSEWHERE if Path(d, "10_nvidia.json").exists()), "")
        if found:
            env["__EGL_VENDOR_LIBRARY_FILENAMES"] = found
            helped.append(f"EGL vendor file only at {found}: __EGL_VENDOR_LIBRARY_FILENAMES names it")
    return env, helped


def applicability(library: str, shipped: str, held: bool, output: str) -> str:
    """'' when the container's probe applies, else why not: the driver ships no such library, or the probe fails on
    the host itself (then the container cannot be blamed)."""
    if not shipped:
        return f"the driver ships no {library}"
    if not held:
        return f"fails on the host too: {(output.strip().splitlines() or ['(no output)'])[-1]}"
    return ""


def check_workloads_on_host(ctx: Context) -> CheckResult:
    """Run the three workloads here; records in ``ctx.host_probes`` whether the OpenCL and EGL container checks
    apply (they do when the driver ships the library and the probe works on the host)."""
    if ctx.kit is None:
        return failed("workloads-on-host", "no unpacked kit")
    env, helped = probe_env(ctx, ctx.kit.loaders)
    outcomes: dict[str, dict[str, object]] = {}
    for program, (library, marker) in PROBES.items():
        shipped = host.shipped_library(library)
        # Each takes seconds; one that hangs (an EGL or OpenCL loader waiting on something) costs a minute at most.
        timeout = max(5.0, min(60.0, ctx.remaining() - 45))
        code, text = host.run_text([str(ctx.kit.workload(program))], timeout=timeout, env=env)
        kind = program.split("-")[0]
        ok = code == 0 and marker in text and (kind == "cuda" or "NVIDIA" in text)
        outcomes[program] = {
            "rc": code,
            "ok": ok,
            "driverLibrary": shipped or "not in the linker cache",
            "output": text[-1500:],
        }
        if kind != "cuda":
            ctx.host_probes[kind] = applicability(library, shipped, ok, text or f"exit {code}")
    cuda = outcomes["cuda-ptx"]
    if not cuda["ok"]:
        return failed("workloads-on-host", f"cuda-ptx on the host: {str(cuda['output']).strip()[-500:]}", **outcomes)
    held = [k for k, v in outcomes.items() if v["ok"]]
    return passed(
        "workloads-on-host",
        f"held on the host: {', '.join(held)}; {'; '.join(helped) or 'no help'}",
        helped=helped,
        **outcomes,
    )
