"""Driver-root discovery: on the simulated node's stub root (versions, missing files, symlinks, two roots) and on
real install layouts (support.driver_layouts)."""

import os
from pathlib import Path, PurePosixPath

import pytest
from support.driver_layouts import LAYOUTS, Layout, build_layout, build_stubs, need_layout_tools
from support.ldcache_files import AARCH64, X86_64, new_format_cache

from dradriver.nvidia_install.driver_root import (
    FOUND_IN_CACHE,
    FOUND_IN_CONF,
    FOUND_IN_DEFAULT,
    DriverRootError,
    discover_driver_root,
    find_library,
)
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
    assert found.libcuda.container_paths == (f"/{LIBDIR}/libcuda.so.{VERSION}", f"/usr/lib64/libcuda.so.{VERSION}")
    assert [f.path.name for f in found.binaries] == [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
        "nvidia-imex",
        "nvidia-imex-ctl",
    ]
    assert {p for f in found.firmware for p in f.container_paths} == {
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
    }
    assert found.library_dirs == (f"/{LIBDIR}", "/usr/lib64")
    assert {p for f in found.binaries for p in f.container_paths} >= {"/usr/bin/nvidia-smi"}


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


def test_the_places_searched_for_libcuda_are_named_as_paths_of_the_root():
    with pytest.raises(DriverRootError) as err:
        discover_driver_root(host_root="/", version="0.0.0-none", machine="x86_64")
    assert "/usr/lib64" in str(err.value) and "//" not in str(err.value)


def test_soname_links_are_found_and_the_development_link_is_added(root: Path):
    links = {s.link: s for s in discover(root).symlinks}
    assert links[f"/{LIBDIR}/libcuda.so.1"].target == f"libcuda.so.{VERSION}"
    assert links[f"/{LIBDIR}/libcuda.so.1"].library == PurePosixPath(f"{LIBDIR}/libcuda.so.{VERSION}")
    assert links[f"/{LIBDIR}/libnvidia-ml.so.1"].target == f"libnvidia-ml.so.{VERSION}"
    assert links[f"/{LIBDIR}/libcuda.so"].target == "libcuda.so.1"
    assert links[f"/{LIBDIR}/libcuda.so"].library is None  # only the hook makes it


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
    assert found.libcuda.path == PurePosixPath(f"usr/lib64/libcuda.so.{VERSION}")
    assert {str(f.path) for f in found.libraries} == {
        f"usr/lib64/libcuda.so.{VERSION}",
        f"usr/lib64/libnvidia-ml.so.{VERSION}",
    }
    # Wherever the host keeps them, a container gets them in both loader families' directories.
    assert {s.link for s in found.symlinks} == {
        f"/{d}/{name}" for d in (LIBDIR, "usr/lib64") for name in ("libcuda.so.1", "libcuda.so")
    }


def test_an_absolute_directory_link_is_followed_inside_the_root_not_in_this_container(root: Path):
    real = root / "opt/driver"
    real.parent.mkdir(parents=True)
    (root / LIBDIR).rename(real)
    (root / LIBDIR).symlink_to("/opt/driver")  # on the host this means <driver root>/opt/driver
    found = discover(root)
    assert found.libcuda.path == PurePosixPath(f"opt/driver/libcuda.so.{VERSION}")
    assert found.libraries and all(str(f.path).startswith("opt/driver/") for f in found.libraries)
    assert f"/{LIBDIR}/libcuda.so.1" in {s.link for s in found.symlinks}


def test_a_link_climbing_out_of_a_linked_directory_is_followed_as_the_kernel_does(root: Path):
    # ".." after a linked directory goes up from where the link leads, not from the link's own name.
    real = root / "opt/nvidia/580" / f"libcuda.so.{VERSION}"
    (root / "opt/nvidia/580/lib").mkdir(parents=True)
    (root / LIBDIR / f"libcuda.so.{VERSION}").rename(real)
    (root / LIBDIR / "current").symlink_to("/opt/nvidia/580/lib")
    (root / LIBDIR / f"libcuda.so.{VERSION}").symlink_to(f"current/../libcuda.so.{VERSION}")
    assert discover(root).libcuda.path == PurePosixPath(f"opt/nvidia/580/libcuda.so.{VERSION}")


def test_a_hook_linked_in_the_driver_root_is_named_by_the_file_the_host_can_run(root: Path):
    # The runtime runs the hook on the host, where an absolute link in /run/nvidia/driver would lead out of it.
    toolkit = root / "usr/local/nvidia/toolkit"
    toolkit.mkdir(parents=True)
    (toolkit / "nvidia-cdi-hook").write_text("#!/bin/sh\n")
    os.chmod(toolkit / "nvidia-cdi-hook", 0o755)
    (root / "usr/bin/nvidia-cdi-hook").symlink_to("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    found = discover(root, host_root="/run/nvidia/driver")
    assert found.cdi_hook == "/run/nvidia/driver/usr/local/nvidia/toolkit/nvidia-cdi-hook"


# --- real install layouts (support.driver_layouts: ELF stubs, the real ldconfig's cache) ------------------------

#: Where each layout's libcuda is, how it is found, and where its nvidia-smi is (relative to --driver-root).
LAYOUT_FACTS = {
    "debian": (f"{LIBDIR}/nvidia/current", FOUND_IN_CACHE, "usr/bin"),
    "runfile": (LIBDIR, FOUND_IN_CACHE, "usr/bin"),
    "rhel": ("usr/lib64", FOUND_IN_CACHE, "usr/bin"),
    "gpu-operator": (LIBDIR, FOUND_IN_CACHE, "usr/bin"),
    "gke": ("lib64", FOUND_IN_DEFAULT, "bin"),
    "h100": ("usr/local/nvidia/lib64", FOUND_IN_CACHE, "usr/local/nvidia/bin"),
    "full": (LIBDIR, FOUND_IN_CACHE, "usr/bin"),
}
# The loaders' built-in search paths (glibc's configure: slibdir and libdir, plus /lib and /usr/lib on Debian).
DEBIAN_LOADER_PATH = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")
RHEL_LOADER_PATH = ("/lib64", "/usr/lib64")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Layout]:
    need_layout_tools()
    base = tmp_path_factory.mktemp("layouts")
    stubs = build_stubs(base / "stubs", VERSION)
    return {name: build_layout(name, base / "roots", stubs) for name in LAYOUTS}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_is_found_where_its_installer_put_it(layouts: dict[str, Layout], name: str) -> None:
    layout = layouts[name]
    libdir, how, bindir = LAYOUT_FACTS[name]
    found = discover_driver_root(host_root=str(layout.driver_root), version=VERSION, machine="x86_64", cdi_hook=None)
    assert found.libcuda.path == PurePosixPath(f"{libdir}/libcuda.so.{VERSION}")
    assert found.libcuda.found_by == how
    names = {f.path.name for f in found.libraries}
    assert {f"libnvidia-ml.so.{VERSION}", f"libGLX_nvidia.so.{VERSION}", f"libvdpau_nvidia.so.{VERSION}"} <= names
    assert found.binaries[0].path == PurePosixPath(f"{bindir}/nvidia-smi")
    assert found.firmware, "the GSP firmware"
    # Whatever the layout, the container paths are the same, and each is on both loader families' default path.
    for lib in found.libraries:
        dirs = {str(PurePosixPath(p).parent) for p in lib.container_paths if "/vdpau/" not in p}
        if dirs:
            assert dirs & set(DEBIAN_LOADER_PATH) and dirs & set(RHEL_LOADER_PATH), lib
    links = {s.link for s in found.symlinks}
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert {f"/{LIBDIR}/{soname}", f"/usr/lib64/{soname}"} <= links
    assert all(p == f"/usr/bin/{f.path.name}" for f in found.binaries for p in f.container_paths)
    if name in ("debian", "runfile"):  # the layouts that ship a Vulkan ICD (in /usr/share and in /etc)
        [icd] = found.config_files
        assert icd.container_paths == ("/usr/share/vulkan/icd.d/nvidia_icd.json",)


def test_a_full_install_gives_egl_platforms_opencl_x_org_and_the_toolkit_s_links(layouts: dict[str, Layout]) -> None:
    found = discover_driver_root(host_root=str(layouts["full"].root), version=VERSION, machine="x86_64", cdi_hook=None)
    names = {f.path.name for f in found.libraries}
    # The EGL platform libraries (versions of their own), named by the EGL platform files, with their sonames.
    platforms = {"libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-wayland.so.1.1.19", "libnvidia-egl-wayland2.so.1.0.0"}
    assert platforms | {"libnvidia-egl-xcb.so.1.0.2", "libnvidia-egl-xlib.so.1.0.2", "libnvidia-nvvm70.so.4"} <= names
    links = {s.link: s.target for s in found.symlinks}
    assert links[f"/{LIBDIR}/libnvidia-egl-gbm.so.1"] == "libnvidia-egl-gbm.so.1.1.2"
    assert links["/usr/lib64/libnvidia-opticalflow.so"] == "libnvidia-opticalflow.so.1"
    inside = {p for f in found.config_files for p in f.container_paths}
    assert "/etc/OpenCL/vendors/nvidia.icd" in inside  # the one place the OpenCL loader looks
    assert "/usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json" in inside
    assert "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf" in inside
    assert not any("vulkansc" in p for p in inside)  # Vulkan SC's ICD: NVIDIA's toolkit leaves it too
    # X.Org's modules where the host has them (an xorg.conf's ModulePath stays right), the GLX module's .so link.
    xorg = {p for f in found.xorg_modules for p in f.container_paths}
    glx = f"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{VERSION}"
    assert xorg == {"/usr/lib/xorg/modules/drivers/nvidia_drv.so", glx}
    assert links["/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"] == PurePosixPath(glx).name
    assert {f.path.name for f in found.binaries} >= {"nvidia-persistenced", "nvidia-imex", "nvidia-xconfig"}
    assert "nvidia-settings" not in {f.path.name for f in found.binaries}
    assert [f.path.name for f in found.firmware] == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert {f.container_paths for f in found.sockets} == {
        ("/run/nvidia-persistenced/socket",),
        ("/run/nvidia-fabricmanager/socket",),
    }


def test_ucode_firmware_is_found_beside_the_gsp_firmware(root: Path) -> None:
    # R615 drivers add ucode files beside the GSP firmware; NVIDIA's toolkit mounts both.
    folder = next(p for p in (root / "lib/firmware/nvidia").rglob("gsp*.bin")).parent
    (folder / "ucode_ga10x.bin").write_text("ucode\n")
    assert "ucode_ga10x.bin" in {f.path.name for f in discover(root).firmware}


def test_the_h100_node_is_found_from_root_through_its_linker_cache_alone(layouts: dict[str, Layout]) -> None:
    # No library in any fixed directory: only etc/ld.so.cache (and ld.so.conf.d behind it) knows the place.
    root = layouts["h100"].root
    found = discover_driver_root(host_root="/", container_root=root, version=VERSION, machine="x86_64")
    assert found.host_path(found.libcuda) == f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"
    (root / "etc/ld.so.cache").rename(root / "etc/ld.so.cache.moved")
    try:
        found = discover_driver_root(host_root="/", container_root=root, version=VERSION, machine="x86_64")
        assert found.libcuda.found_by == FOUND_IN_CONF
    finally:
        (root / "etc/ld.so.cache.moved").rename(root / "etc/ld.so.cache")


def test_aarch64_names_are_found_and_mounted_in_aarch64_directories(tmp_path: Path) -> None:
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="aarch64")
    found = discover_driver_root(host_root=str(root), version=VERSION, machine="aarch64", cdi_hook=None)
    assert found.libcuda.path == PurePosixPath(f"usr/lib/aarch64-linux-gnu/libcuda.so.{VERSION}")
    assert found.libcuda.container_paths == (
        f"/usr/lib/aarch64-linux-gnu/libcuda.so.{VERSION}",
        f"/usr/lib64/libcuda.so.{VERSION}",
    )
    assert found.library_dirs == ("/usr/lib/aarch64-linux-gnu", "/usr/lib64")


def test_find_library_reports_how_or_where_it_searched(layouts: dict[str, Layout], tmp_path: Path) -> None:
    path, how = find_library(layouts["h100"].root, "libnvidia-ml.so.1", machine="x86_64")
    assert path == PurePosixPath(f"usr/local/nvidia/lib64/libnvidia-ml.so.{VERSION}") and how == FOUND_IN_CACHE
    path, searched = find_library(tmp_path, "libnvidia-ml.so.1", machine="x86_64")
    assert path is None and "/usr/lib64" in searched


def test_an_aarch64_root_is_found_through_its_cache_and_x86_entries_are_ignored(tmp_path: Path) -> None:
    # /usr/local/nvidia/lib64 is in no usual directory: only the cache knows it. A stray x86-64 entry names a
    # copy elsewhere, which an aarch64 node must not take (and an x86-64 one takes).
    root = tmp_path / "root"
    for libdir in ("usr/local/nvidia/lib64", "opt/x86"):
        (root / libdir).mkdir(parents=True)
        for stem, soname in (("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")):
            (root / libdir / f"{stem}.{VERSION}").write_text(f"{libdir}\n")
            (root / libdir / soname).symlink_to(f"{stem}.{VERSION}")
    (root / "etc/ld.so.cache").parent.mkdir()
    (root / "etc/ld.so.cache").write_bytes(
        new_format_cache(
            [
                (AARCH64, "libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"),
                (AARCH64, "libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"),
                (X86_64, "libcuda.so.1", "/opt/x86/libcuda.so.1"),
            ]
        )
    )
    arm = discover_driver_root(host_root="/", container_root=root, version=VERSION, machine="aarch64")
    assert arm.libcuda.path == PurePosixPath(f"usr/local/nvidia/lib64/libcuda.so.{VERSION}")
    assert arm.libcuda.found_by == FOUND_IN_CACHE
    assert arm.libcuda.container_paths[0] == f"/usr/lib/aarch64-linux-gnu/libcuda.so.{VERSION}"
    assert find_library(root, "libnvidia-ml.so.1", machine="aarch64")[0] == PurePosixPath(
        f"usr/local/nvidia/lib64/libnvidia-ml.so.{VERSION}"
    )
    x86 = discover_driver_root(host_root="/", container_root=root, version=VERSION, machine="x86_64")
    assert x86.libcuda.path == PurePosixPath(f"opt/x86/libcuda.so.{VERSION}")
