"""`dradriver doctor` on every install layout (support.driver_layouts), intact and broken the ways nodes break:
each broken one gets a FAIL whose fix names what to do, and the exit status is 0 only when nothing fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.driver_layouts import LAYOUTS, Layout, build_layout, build_stubs, need_layout_tools
from support.nodes import inventory_of

from dradriver.cli.main import main

VERSION = inventory_of("dgx-a100-80gb").driver_version  # the simulated node's driver: the layouts are built for it


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    need_layout_tools()
    return build_stubs(tmp_path_factory.mktemp("stubs"), VERSION)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node's other directories, all present and right: CDI dir, kubelet dirs, containerd 2.x config."""
    for folder in ("cdi", "registry", "plugins/gpu.dradriver.dev", "device-plugins"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "containerd.toml").write_text(
        f'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\ncdi_spec_dirs = ["{tmp_path / "cdi"}"]\n'
    )
    hook = tmp_path / "image/nvidia-cdi-hook"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    return tmp_path


def doctor(node: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict[str, dict[str, Any]]]:
    code = main(
        [
            "doctor",
            "--gpu-backend",
            "sim",
            "--cdi-dir",
            str(node / "cdi"),
            "--registry-dir",
            str(node / "registry"),
            "--plugin-dir",
            str(node / "plugins/gpu.dradriver.dev"),
            "--containerd-config",
            str(node / "containerd.toml"),
            "--crio-config",
            str(node / "no-crio.conf"),
            "--cdi-hook-source",
            str(node / "image/nvidia-cdi-hook"),
            "--device-plugins-dir",
            str(node / "device-plugins"),
            "-o",
            "json",
            *flags,
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] == (code == 0)
    return code, {check["name"]: check for check in report["checks"]}


def roots(layout: Layout) -> list[str]:
    return ["--driver-root", str(layout.driver_root)]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_intact_layout_passes(stubs, node: Path, capsys, name: str) -> None:
    layout = build_layout(name, node / "roots", stubs)
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 0, {n: c for n, c in checks.items() if c["status"] == "FAIL"}
    assert checks["libcuda"]["status"] == "OK" and "libcuda.so" in checks["libcuda"]["detail"]
    for library_class in ("CUDA libraries", "NVML libraries", "video libraries", "graphics libraries"):
        assert checks[library_class]["status"] == "OK"
    assert "nvidia-smi" in checks["binaries"]["detail"]
    assert checks["CDI hook"]["status"] == "OK"


@pytest.mark.parametrize(
    ("name", "expected_fix"),
    [("gpu-operator", "--driver-root /run/nvidia/driver"), ("gke", "--driver-root /home/kubernetes/bin/nvidia")],
)
def test_a_driver_kept_outside_root_named_as_root_fails_naming_the_right_root(
    stubs, node: Path, capsys, name: str, expected_fix: str
) -> None:
    layout = build_layout(name, node / "roots", stubs)
    code, checks = doctor(node, capsys, "--driver-root", "/", "--container-driver-root", str(layout.root))
    assert code == 1
    assert checks["libcuda"]["status"] == "FAIL" and expected_fix in checks["libcuda"]["fix"]


def test_an_unregistered_usr_local_nvidia_fails_and_a_stale_cache_warns(stubs, node: Path, capsys) -> None:
    layout = build_layout("h100", node / "roots", stubs)
    host = ["--driver-root", "/", "--container-driver-root", str(layout.root)]
    (layout.root / "etc/ld.so.cache").unlink()
    code, checks = doctor(node, capsys, *host)
    assert code == 0 and checks["libcuda"]["status"] == "WARN" and "run ldconfig" in checks["libcuda"]["fix"]
    shutil.rmtree(layout.root / "etc")
    code, checks = doctor(node, capsys, *host)
    assert code == 1 and checks["libcuda"]["status"] == "FAIL"
    assert "--driver-root /usr/local/nvidia" in checks["libcuda"]["fix"]


@pytest.mark.parametrize("name", ["debian", "runfile", "rhel"])
def test_a_half_done_upgrade_fails_naming_the_missing_version(stubs, node: Path, capsys, name: str) -> None:
    layout = build_layout(name, node / "roots", stubs)
    for lib in layout.root.rglob(f"libcuda.so.{VERSION}"):
        lib.unlink()
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 1
    assert f"libcuda.so.{VERSION}" in checks["libcuda"]["detail"]
    assert "install the driver's user-space libraries of this version" in checks["libcuda"]["fix"]


def test_a_runtime_without_cdi_or_without_our_spec_directory_fails(stubs, node: Path, capsys) -> None:
    layout = build_layout("runfile", node / "roots", stubs)
    (node / "containerd.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n')
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 1 and "enable_cdi = true" in checks["containerd CDI"]["fix"]
    (node / "containerd.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = true\ncdi_spec_dirs = ["/etc/cdi"]\n'
    )
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 1 and f"add {node / 'cdi'} to cdi_spec_dirs" in checks["containerd CDI"]["fix"]
    (node / "containerd.toml").unlink()
    (node / "crio.conf").write_text(f'[crio.runtime]\ncdi_spec_dirs = ["{node / "cdi"}"]\n')
    code, checks = doctor(node, capsys, *roots(layout), "--crio-config", str(node / "crio.conf"))
    assert code == 0 and checks["CRI-O CDI"]["status"] == "OK"


def test_missing_directories_and_no_nvml_fail_with_their_fixes(stubs, node: Path, capsys) -> None:
    layout = build_layout("runfile", node / "roots", stubs)
    (node / "cdi").rmdir()
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 1 and checks["CDI directory"]["status"] == "FAIL" and "--cdi-dir" in checks["CDI directory"]["fix"]
    code, checks = doctor(node, capsys, "--gpu-backend", "nvml", "--driver-root", str(node / "nowhere"))
    assert code == 1 and checks["NVML"]["status"] == "FAIL" and "--driver-root" in checks["NVML"]["fix"]
    assert checks["libcuda"]["status"] == "FAIL"


def test_the_table_shows_each_fail_with_its_fix(stubs, node: Path, capsys) -> None:
    layout = build_layout("gke", node / "roots", stubs)
    flags = ["--driver-root", "/", "--container-driver-root", str(layout.root), "-o", "table"]
    code = main(["doctor", "--gpu-backend", "sim", "--cdi-dir", str(node / "cdi"), *flags])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
    fixes = [line.strip() for line in out.splitlines() if line.strip().startswith("fix: ")]
    assert any("set --driver-root /home/kubernetes/bin/nvidia" in fix for fix in fixes), out


def test_the_hook_source_is_judged_as_run_uses_it(stubs, node: Path, capsys) -> None:
    # run copies the source and makes the copy executable: a plain file is enough, a missing one is not.
    layout = build_layout("runfile", node / "roots", stubs)
    (node / "image/nvidia-cdi-hook").chmod(0o644)
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 0 and checks["CDI hook"]["status"] == "OK"
    missing = str(node / "image/missing-hook")
    code, checks = doctor(node, capsys, *roots(layout), "--cdi-hook-source", missing)
    assert code == 1 and checks["CDI hook"]["detail"] == f"--cdi-hook-source {missing} is not a file"


def test_nvidia_device_plugin_on_the_node_is_a_fail_row_with_its_fix(stubs, node: Path, capsys) -> None:
    layout = build_layout("h100", node / "roots", stubs)
    code, checks = doctor(node, capsys, *roots(layout))
    assert code == 0 and checks["device plugin"]["status"] == "OK"
    assert f"no nvidia-gpu*.sock or nvidia-mig-*.sock in {node / 'device-plugins'}" in checks["device plugin"]["detail"]
    (node / "device-plugins/nvidia-gpu.sock").touch()
    code, checks = doctor(node, capsys, *roots(layout))
    row = checks["device plugin"]
    assert code == 1 and row["status"] == "FAIL" and "nvidia-gpu.sock" in row["detail"]
    assert "nodeSelector" in row["fix"] and "--device-plugin-coexistence withhold" in row["fix"]


def test_the_nodes_nvidia_gpu_capacity_is_read_through_the_kubeconfig(stubs, node: Path, capsys) -> None:
    from support.apiserver import FakeApiServer

    layout = build_layout("h100", node / "roots", stubs)
    with FakeApiServer() as api:
        api.create("nodes", {"metadata": {"name": "gpu-1"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})
        kubeconfig = str(api.write_kubeconfig(node / "kubeconfig"))
        code, checks = doctor(node, capsys, *roots(layout), "--kubeconfig", kubeconfig, "--node-name", "gpu-1")
        assert code == 1 and checks["device plugin"]["detail"].endswith("the Node advertises nvidia.com/gpu: 8")
        # The Network Operator's NICs under nvidia.com/ on a GPUDirect node are not the GPU plugin.
        nics = {"cpu": "8", "nvidia.com/hostdev": "4", "nvidia.com/sriov_rdma": "8"}
        api.create("nodes", {"metadata": {"name": "gpu-2"}, "status": {"capacity": nics}})
        code, checks = doctor(node, capsys, *roots(layout), "--kubeconfig", kubeconfig, "--node-name", "gpu-2")
        assert (
            checks["device plugin"]["status"] == "OK"
            and "no nvidia.com/gpu* or nvidia.com/mig-* on the Node" in (checks["device plugin"]["detail"])
        )
