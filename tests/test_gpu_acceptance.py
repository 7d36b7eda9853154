"""scripts/gpu-acceptance where there is no GPU (here and in CI): every check skipped, in under a minute, with the
report's shape; and what of the kit can be judged without a GPU (tests/support/gpu_acceptance): the workloads
built and run against a fake libcuda, the comparisons the checks make, the imports each side may use, and what
keeps one scarce GPU run useful when something goes wrong (the report on disk as it grows, a session that runs
out of time, a leftover the last check must see)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import required
from support.gpu_acceptance import host
from support.gpu_acceptance.container import parse_workloads
from support.gpu_acceptance.host_checks import Context, inventory_problems, junit_counts, release_problems
from support.gpu_acceptance.kit import install_venv
from support.gpu_acceptance.left_as_found import check_left_as_found
from support.gpu_acceptance.mps_checks import limit_problems
from support.gpu_acceptance.report import CHECK_NAMES, EXIT_NO_GPU, Report, passed
from support.gpu_acceptance.session import Recorder

REPO = Path(__file__).resolve().parents[1]
UUID = "GPU-2759b7b7-3fe6-db9e-e789-517091f13056"
SMI_ROW = {
    "index": "0",
    "uuid": UUID,
    "name": "NVIDIA H100 80GB HBM3",
    "pci.bus_id": "00000000:1B:00.0",
    "memory.total": "81559",
    "driver_version": "580.159.04",
    "compute_mode": "Default",
    "mig.mode.current": "Disabled",
    "compute_cap": "9.0",
}
INVENTORY = {
    "driverVersion": "580.159.04",
    "gpus": [
        {
            "uuid": UUID,
            "productName": "NVIDIA H100 80GB HBM3",
            "pciBusId": "0000:1b:00.0",
            "memoryBytes": 81559 * 1024 * 1024,
            "cudaComputeCapability": "9.0",
            "migEnabled": False,
        }
    ],
}
# The few driver-API entry points cuda-ptx calls; its "launch" runs the kernel's arithmetic on the host.
FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef unsigned long long P;
int cuInit(unsigned f) { (void)f; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *c) { *c = 1; return 0; }
int cuDeviceGet(int *d, int o) { *d = o; return 0; }
int cuDeviceGetName(char *n, int l, int d) { (void)d; strncpy(n, "Fake GPU", l); return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) { (void)d; *v = a == 75 ? 9 : a == 16 ? 132 : 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
int cuCtxSetCurrent(void *c) { (void)c; return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1; *t = 2; return 0; }
int cuModuleLoadDataEx(void **m, const char *ptx, unsigned n, int *o, void **v) {
    (void)n; (void)o; (void)v; *m = (void *)1; return strstr(ptx, ".entry scale_add(") ? 0 : 218;
}
int cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m; *f = (void *)1; return strcmp(name, "scale_add") ? 500 : 0;
}
int cuModuleUnload(void *m) { (void)m; return 0; }
int cuMemAlloc_v2(P *p, size_t b) { *p = (P)(uintptr_t)malloc(b); return 0; }
int cuMemFree_v2(P p) { free((void *)(uintptr_t)p); return 0; }
int cuMemcpyHtoD_v2(P d, const void *s, size_t b) { memcpy((void *)(uintptr_t)d, s, b); return 0; }
int cuMemcpyDtoH_v2(void *d, P s, size_t b) { memcpy(d, (void *)(uintptr_t)s, b); return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **p, void **extra) {
    float *out = (float *)(uintptr_t)*(P *)p[0];
    const float *in = (const float *)(uintptr_t)*(P *)p[1];
    float a = *(float *)p[2];
    unsigned n = *(unsigned *)p[3];
    for (unsigned i = 0; i < n && i < gx * bx; i++) out[i] = a * in[i] + (float)i;
    (void)f; (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
    return 0;
}
int cuCtxSynchronize(void) { return 0; }
int cuGetErrorString(int r, const char **s) { (void)r; *s = "fake"; return 0; }
"""


def test_without_a_gpu_every_check_is_skipped_in_under_a_minute(tmp_path: Path) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU: the kit would run for real (docs/development.md says how)")
    started = time.monotonic()
    done = subprocess.run(
        [str(REPO / "scripts/gpu-acceptance"), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - started < 60
    assert done.returncode == EXIT_NO_GPU, done.stdout + done.stderr
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert set(report) == {"tool", "version", "rehearsal", "started", "wallSeconds", "host", "checks", "counts",
                           "exitStatus"}  # fmt: skip
    assert report["exitStatus"] == EXIT_NO_GPU and report["host"]["gpu"] is False
    assert [c["name"] for c in report["checks"]] == list(CHECK_NAMES)
    for check in report["checks"]:
        assert set(check) == {"name", "title", "status", "reason", "seconds", "details"}
        assert check["status"] == "skip" and check["reason"].startswith("no GPU: skipped"), check
        assert check["title"]
    assert report["counts"] == {"pass": 0, "fail": 0, "skip": len(CHECK_NAMES)}
    summary = (tmp_path / "out/summary.txt").read_text().splitlines()
    assert len(summary) == len(CHECK_NAMES) + 2
    assert summary[-1].startswith(f"0 passed, 0 failed, {len(CHECK_NAMES)} skipped; exit 3")
    assert done.stdout.splitlines() == summary


def test_the_outer_kit_runs_on_the_standard_library_alone() -> None:
    # On the GPU machine it runs before the kit's venv exists: `python -S` sees no site-packages.
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import support.gpu_acceptance.main, support.gpu_acceptance.prepare"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    assert done.returncode == 0, done.stderr


def test_the_node_session_imports_nothing_the_kit_leaves_out() -> None:
    # The kit's venv has the runtime dependencies and pytest: none of the test-only packages.
    left_out = ("kubernetes_validate", "cryptography", "hypothesis", "jsonschema", "xdist")
    code = f"import sys; sys.modules.update(dict.fromkeys({left_out!r})); import support.gpu_acceptance.node_session"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "src")])},
    )
    assert done.returncode == 0, done.stderr


def test_the_cuda_program_jit_loads_its_ptx_and_checks_every_element(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        required.need("cc", "the test builds the kit's workloads", "apt-get install gcc (`scripts/test` does)")
    from support.gpu_acceptance.prepare import workloads

    built = workloads(tmp_path / "build")
    missing = subprocess.run([str(built["cuda-ptx"])], capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)})  # fmt: skip
    assert missing.returncode == 2 and "error=dlopen libcuda.so.1" in missing.stdout
    (tmp_path / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"),
                    str(tmp_path / "fake.c")], check=True, capture_output=True, timeout=60)  # fmt: skip
    done = subprocess.run([str(built["cuda-ptx"])], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stdout
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert values["ptx_jit"] == "ok" and values["wrong"] == "0" and values["elements"] == str(1 << 20)
    assert values["device_name"] == "Fake GPU" and values["compute_capability"] == "9.0"
    assert done.stdout.splitlines()[-1] == "CUDA_PTX_OK"
    for probe in ("opencl-probe", "egl-probe"):  # built with -Werror; they run where a loader is found
        assert built[probe].stat().st_size > 0


def test_inventory_and_nvidia_smi_are_compared_field_by_field() -> None:
    assert inventory_problems(INVENTORY, [SMI_ROW]) == []
    assert inventory_problems(INVENTORY, [{**SMI_ROW, "memory.total": "81920"}]) == [
        f"{UUID} memory MiB: inventory '81559', nvidia-smi '81920'"
    ]
    other = {**SMI_ROW, "uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    assert inventory_problems(INVENTORY, [other]) == [
        f"{other['uuid']}: in nvidia-smi, not in the inventory",
        f"{UUID}: in the inventory, not in nvidia-smi",
    ]


def test_the_release_probe_fails_on_a_gpu_node_left_open_or_gpus_counted_differently() -> None:
    held = ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    probe = {"before": [UUID], "after": [UUID], "openBefore": held, "openDuring": [], "openAfter": held}
    assert release_problems(probe) == []
    assert release_problems({**probe, "openDuring": ["/dev/nvidiactl"]}) == []  # the control node holds no GPU
    assert release_problems({**probe, "openDuring": ["/dev/nvidia0", "/dev/dri/renderD128"]}) == [
        "still open while NVML is let go: /dev/nvidia0, /dev/dri/renderD128 (an unbind would wait for them)"
    ]
    assert release_problems({**probe, "after": []}) == [f"GPUs before the release {[UUID]}, after it []"]
    assert release_problems({**probe, "openBefore": ["/dev/nvidiactl"]}) == [
        "no /dev/nvidiaN open before the release: the probe shows nothing (NVML attaches lazily?)"
    ]


def test_nvidia_smi_fields_this_version_does_not_know_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        "echo '0, GPU-1, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 40960, 580.65.06, Default, Enabled'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    [row] = host.smi_gpus()
    assert "compute_cap" not in row
    assert row["mig.mode.current"] == "Enabled" and row["pci.bus_id"] == "00000000:07:00.0"
    assert host.gpu_modes([row]) == {"GPU-1": {"computeMode": "Default", "migMode": "Enabled"}}
    assert host.normalize_bus_id(row["pci.bus_id"]) == "0000:07:00.0"


def test_container_output_is_read_workload_by_workload() -> None:
    output = (
        "=== BEGIN cuda\nmultiprocessors=132\nnoise\nCUDA_PTX_OK\n=== END cuda rc=0\n=== BEGIN egl\n=== END egl rc=1\n"
    )
    found = parse_workloads(output)
    assert found["cuda"].rc == 0 and found["cuda"].values == {"multiprocessors": "132"}
    assert found["egl"].rc == 1 and found["egl"].output == ""


def test_mps_limits_are_read_as_numbers() -> None:
    assert limit_problems({"percentage": "50.0", "memory": "4096M"}) == []
    assert limit_problems({"percentage": "50", "memory": "4096 MB"}) == []
    assert limit_problems({"percentage": "100.0", "memory": "error: no daemon"}) == [
        "thread limit '100.0', wanted 50.0",
        "memory limit 'error: no daemon', wanted 4096M",
    ]


def test_junit_reports_are_counted(tmp_path: Path) -> None:
    (tmp_path / "r.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="boom"/></testcase>'
        '<testcase classname="t" name="c"><skipped message="no MIG"/></testcase></testsuite></testsuites>'
    )
    counts = junit_counts(tmp_path / "r.xml")
    assert (counts["passed"], counts["failed"], counts["skippedTests"]) == (1, {"t::b": "boom"}, {"t::c": "no MIG"})


def test_the_report_is_on_disk_after_every_result_so_a_killed_run_leaves_what_it_found(tmp_path: Path) -> None:
    rep = Report(out=tmp_path)
    rep.add(passed("doctor", "8 OK"))
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["partial"] is True
    checks = {c["name"]: c for c in document["checks"]}
    assert checks["doctor"]["status"] == "pass"
    assert checks["nvml-contract"]["reason"] == "not reached"
    assert rep.pending()[0] == "nvml-contract"  # writing it recorded nothing for the checks not yet run


def test_left_as_found_sees_each_driver_instance_s_specs_and_a_session_that_never_stopped_its_drivers(
    tmp_path: Path,
) -> None:
    ctx = Context(REPO, tmp_path, tmp_path / "out", sys.executable, time.monotonic() + 60, rehearse=True)
    clean = {"driverExitHook": 0, "driverExitNoHook": 0, "containersLeft": []}
    assert check_left_as_found(ctx, clean).status == "pass"
    spec = tmp_path / "node/b/cdi/k8s.gpu.dradriver.dev-claim_uid-1.json"
    spec.parent.mkdir(parents=True)
    spec.write_text("{}")
    result = check_left_as_found(ctx, {"driverExitHook": 0})
    assert result.status == "fail"
    assert f"CDI spec left: {spec}" in result.reason
    assert "driverExitNoHook: unknown, the node session ended before it stopped that driver instance" in result.reason


def test_a_session_near_its_deadline_skips_what_it_cannot_finish_and_an_error_fails_only_its_checks(
    tmp_path: Path,
) -> None:
    rec = Recorder(tmp_path / "results.json", deadline=time.time() + Recorder.RESERVE_S - 1)
    assert rec.timed("mps", lambda: passed("mps", "held")).reason == "out of time: the run's deadline is near"

    def broken() -> None:
        rec.add(passed("container-nohook-nvidia-smi", "held"))
        raise OSError("runc: permission denied")

    rec = Recorder(tmp_path / "results.json")
    rec.guarded(["container-nohook-nvidia-smi", "container-nohook-cuda"], broken)
    assert [(r.name, r.status, r.reason) for r in rec.results] == [
        ("container-nohook-nvidia-smi", "pass", "held"),
        ("container-nohook-cuda", "fail", "OSError: runc: permission denied"),
    ]


def test_wheels_for_another_python_are_refused_before_any_venv_is_made(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels/pip-25.3-py3-none-any.whl").write_bytes(b"")
    problem = install_venv(tmp_path, tmp_path / "venv", "3.99", timeout=10)
    assert problem.startswith("the kit's wheels are for Python 3.99; this machine has 3.")
    assert not (tmp_path / "venv").exists()
