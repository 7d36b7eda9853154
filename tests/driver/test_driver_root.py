"""Driver-root discovery on the simulated node's stub driver root: versions, missing files, symlinks, two roots."""

import os
from pathlib import Path, PurePosixPath

import pytest

from dradriver.driver.driver_root import DriverRootError, discover_driver_root
from dradriver.sim.driver_root import write_stub_driver_root

VERSION = "580.65.06"
LIBDIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_stub_driver_root(tmp_path / "driver-root", VERSION, machine="x86_64")


def discover(root: Path, **kwargs):
    kwargs.setdefault("host_root", str(root))
    return discover_driver_root(container_root=root, version=VERSION, machine="x86_64", **kwargs)


def test_finds_the_libraries_of_the_running_version_binaries_and_firmware(root: Path):
    found = discover(root)
    names = {f.path.name for f in found.libraries}
    assert {f"libcuda.so.{VERSION}", f"libnvidia-ml.so.{VERSION}", f"libnvidia-ptxjitcompiler.so.{VERSION}"} <= names
    assert {f"libnvidia-nvvm.so.{VERSION}", f"libcudadebugger.so.{VERSION}"} <= names
    assert found.libcuda.container_path == f"/{LIBDIR}/libcuda.so.{VERSION}"
    assert [f.path.name for f in found.binaries] == [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ]
    assert {f.container_path for f in found.firmware} == {
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    }
    assert found.library_dirs == (f"/{LIBDIR}",)


def test_libraries_of_another_driver_version_are_left_out(root: Path):
    (root / LIBDIR / "libcuda.so.550.54.15").write_text("old")
    (root / LIBDIR / "libnvidia-ml.so.550.54.15").write_text("old")
    names = {f.path.name for f in discover(root).libraries}
    assert not any("550.54.15" in n for n in names)
    with pytest.raises(DriverRootError, match=r"libcuda\.so\.999\.1 of the running NVIDIA driver 999\.1"):
        discover_driver_root(host_root=str(root), version="999.1", machine="x86_64")


def test_missing_libcuda_is_an_error_naming_both_flags(root: Path):
    (root / LIBDIR / f"libcuda.so.{VERSION}").unlink()
    with pytest.raises(DriverRootError) as err:
        discover(root, host_root="/run/nvidia/driver")
    assert "--driver-root" in str(err.value) and "--container-driver-root" in str(err.value)
    with pytest.raises(DriverRootError, match="not a directory"):
        discover_driver_root(host_root="/", container_root=root / "nowhere", version=VERSION)


def test_missing_optional_files_are_skipped(root: Path):
    (root / "usr/bin/nvidia-debugdump").unlink()
    (root / LIBDIR / f"libcudadebugger.so.{VERSION}").unlink()
    for gsp in (root / "lib/firmware/nvidia" / VERSION).iterdir():
        gsp.unlink()
    found = discover(root)
    assert "nvidia-debugdump" not in {f.path.name for f in found.binaries}
    assert f"libcudadebugger.so.{VERSION}" not in {f.path.name for f in found.libraries}
    assert found.firmware == ()
    # The soname link of the removed library dangles now: it is not recreated in containers either.
    assert "/usr/lib/x86_64-linux-gnu/libcudadebugger.so.1" not in {s.link for s in found.symlinks}


def test_soname_links_are_found_and_the_development_link_is_added(root: Path):
    links = {s.link: s for s in discover(root).symlinks}
    assert links[f"/{LIBDIR}/libcuda.so.1"].target == f"libcuda.so.{VERSION}"
    assert links[f"/{LIBDIR}/libcuda.so.1"].installed
    assert links[f"/{LIBDIR}/libnvidia-ml.so.1"].target == f"libnvidia-ml.so.{VERSION}"
    assert links[f"/{LIBDIR}/libcuda.so"].target == "libcuda.so.1"
    assert not links[f"/{LIBDIR}/libcuda.so"].installed


def test_symlinked_libraries_are_resolved_inside_the_root_and_dangling_ones_skipped(root: Path):
    # A distribution that keeps the real file elsewhere and links it by absolute path (meaning the host's /).
    real = root / "opt/nvidia" / f"libnvidia-ml.so.{VERSION}"
    real.parent.mkdir(parents=True)
    (root / LIBDIR / f"libnvidia-ml.so.{VERSION}").rename(real)
    (root / LIBDIR / f"libnvidia-ml.so.{VERSION}").symlink_to(f"/opt/nvidia/libnvidia-ml.so.{VERSION}")
    (root / LIBDIR / f"libnvidia-gone.so.{VERSION}").symlink_to("nowhere.so")
    found = discover(root)
    paths = {str(f.path) for f in found.libraries}
    assert f"opt/nvidia/libnvidia-ml.so.{VERSION}" in paths
    assert not any("libnvidia-gone" in p for p in paths)


def test_a_merged_usr_layout_does_not_mount_a_library_twice(tmp_path: Path):
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="x86_64")
    (root / "lib/x86_64-linux-gnu").symlink_to("../usr/lib/x86_64-linux-gnu")
    found = discover(root)
    names = [f.path.name for f in found.libraries]
    assert len(names) == len(set(names))


def test_host_paths_name_the_host_driver_root(root: Path):
    found = discover(root, host_root="/run/nvidia/driver")
    assert found.host_root == PurePosixPath("/run/nvidia/driver")
    assert found.host_path(found.libcuda) == f"/run/nvidia/driver/{LIBDIR}/libcuda.so.{VERSION}"
    with pytest.raises(DriverRootError, match="absolute"):
        discover(root, host_root="run/nvidia/driver")


def test_the_hook_is_found_in_the_driver_root_or_taken_as_given(root: Path):
    assert discover(root).cdi_hook is None
    hook = root / "usr/bin/nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\n")
    os.chmod(hook, 0o755)
    assert discover(root, host_root="/").cdi_hook == "/usr/bin/nvidia-cdi-hook"
    assert discover(root, cdi_hook=None).cdi_hook is None
    assert discover(root, cdi_hook="/usr/local/nvidia/toolkit/nvidia-cdi-hook").cdi_hook == (
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    )


def test_only_the_native_library_directory_is_mounted(root: Path):
    # A 64-bit RHEL-style host: /usr/lib64 first, 32-bit compatibility copies in /usr/lib.
    lib64 = root / "usr/lib64"
    lib64.mkdir()
    (lib64 / f"libcuda.so.{VERSION}").write_text("64-bit")
    (lib64 / f"libnvidia-ml.so.{VERSION}").write_text("64-bit")
    (lib64 / "libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    (root / "usr/lib" / f"libcuda.so.{VERSION}").write_text("32-bit")
    found = discover(root)
    assert found.libcuda.container_path == f"/usr/lib64/libcuda.so.{VERSION}"
    assert {f.container_path for f in found.libraries} == {
        f"/usr/lib64/libcuda.so.{VERSION}",
        f"/usr/lib64/libnvidia-ml.so.{VERSION}",
    }
    assert found.library_dirs == ("/usr/lib64",)
    assert {s.link for s in found.symlinks} == {"/usr/lib64/libcuda.so.1", "/usr/lib64/libcuda.so"}


def test_an_absolute_directory_link_is_followed_inside_the_root_not_in_this_container(root: Path):
    real = root / "opt/driver"
    real.parent.mkdir(parents=True)
    (root / LIBDIR).rename(real)
    (root / LIBDIR).symlink_to("/opt/driver")  # on the host this means <driver root>/opt/driver
    found = discover(root)
    assert found.libcuda.container_path == f"/opt/driver/libcuda.so.{VERSION}"
    assert all(str(f.path).startswith("opt/driver/") for f in found.libraries)
    assert "/opt/driver/libcuda.so.1" in {s.link for s in found.symlinks}
