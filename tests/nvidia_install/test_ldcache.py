"""The linker-cache reader against caches the real ``ldconfig`` writes, in each of its three formats."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path, PurePosixPath

import pytest
from support import required
from support.ldcache_files import AARCH64, I386, S390X, X86_64, new_format_cache

from dradriver.nvidia_install import ldcache


@pytest.fixture(scope="module")  # before the module's stub libraries are built with cc
def ldconfig_and_cc() -> None:
    missing = [tool for tool in ("ldconfig", "cc") if shutil.which(tool) is None]
    required.need_tools(missing, "the real ldconfig writes caches of stub libraries cc builds",
                        "apt-get install gcc libc-bin (`scripts/test` does)")  # fmt: skip


def _shared_object(path: Path, soname: str, *flags: str) -> None:
    source = path.with_suffix(".c")
    source.write_text("int stub(void) { return 1; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", *flags, f"-Wl,-soname,{soname}", "-o", str(path), str(source)],
        check=True,
        capture_output=True,
    )
    source.unlink()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ldroot")
    lib = root / "usr/local/nvidia/lib64"
    lib.mkdir(parents=True)
    _shared_object(lib / "libcuda.so.580.159.04", "libcuda.so.1")
    _shared_object(lib / "libnvidia-ml.so.580.159.04", "libnvidia-ml.so.1")
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("# comment\ninclude ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text("/usr/local/nvidia/lib64\n")
    return root


@pytest.mark.usefixtures("ldconfig_and_cc")
@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_each_format_ldconfig_writes_is_read(root: Path, fmt: str) -> None:
    subprocess.run(["ldconfig", "-X", "-r", str(root), "-c", fmt], check=True, capture_output=True)
    entries = ldcache.native(ldcache.parse((root / "etc/ld.so.cache").read_bytes()), "x86_64")
    by_name = {e.soname: e.path for e in entries}
    assert by_name["libcuda.so.1"] == "/usr/local/nvidia/lib64/libcuda.so.1"
    assert by_name["libnvidia-ml.so.1"] == "/usr/local/nvidia/lib64/libnvidia-ml.so.1"
    assert ldcache.read_cache(root, "x86_64") == entries


@pytest.mark.usefixtures("ldconfig_and_cc")
def test_entries_of_another_machine_are_dropped(root: Path) -> None:
    subprocess.run(["ldconfig", "-X", "-r", str(root)], check=True, capture_output=True)
    entries = ldcache.parse((root / "etc/ld.so.cache").read_bytes())
    assert entries and all(e.flags == ldcache.FLAG_ELF_LIBC6 | ldcache.MACHINE_FLAGS["x86_64"] for e in entries)
    assert ldcache.native(entries, "aarch64") == ()


def test_32_bit_and_aarch64_entries_are_told_apart() -> None:
    data = new_format_cache(
        [
            (X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            (I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
            (AARCH64, "libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1"),
        ]
    )
    entries = ldcache.parse(data)
    assert [e.path for e in ldcache.native(entries, "x86_64")] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert [e.path for e in ldcache.native(entries, "aarch64")] == ["/usr/lib/aarch64-linux-gnu/libcuda.so.1"]


def test_a_big_endian_cache_is_read_in_the_byte_order_its_header_names() -> None:
    # s390x's ldconfig writes its own byte order and, since glibc 2.32, says so in the header's flags.
    data = new_format_cache([(S390X, "libcuda.so.1", "/usr/lib64/libcuda.so.1")], big_endian=True)
    assert [(e.soname, e.path) for e in ldcache.native(ldcache.parse(data), "s390x")] == [
        ("libcuda.so.1", "/usr/lib64/libcuda.so.1")
    ]


def test_the_cache_and_ld_so_conf_are_read_through_links_inside_the_root(tmp_path: Path) -> None:
    # Debian's alternatives make an ld.so.conf.d file an absolute link; such a link means the root's /, not the
    # plugin container's, and the same holds for the include directory and the cache itself.
    root = tmp_path / "root"
    (root / "etc/alternatives").mkdir(parents=True)
    (root / "opt/conf.d").mkdir(parents=True)
    (root / "usr/lib/nvidia").mkdir(parents=True)
    (root / "var/cache/ldconfig").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d").symlink_to("/opt/conf.d")
    (root / "opt/conf.d/x86_64-linux-gnu_GL.conf").symlink_to("/etc/alternatives/x86_64-linux-gnu_gl_conf")
    (root / "etc/alternatives/x86_64-linux-gnu_gl_conf").symlink_to("/usr/lib/nvidia/ld.so.conf")
    (root / "usr/lib/nvidia/ld.so.conf").write_text("/usr/lib/nvidia/current\n")
    assert ldcache.conf_dirs(root) == (PurePosixPath("/usr/lib/nvidia/current"),)
    (root / "var/cache/ldconfig/ld.so.cache").write_bytes(
        new_format_cache([(X86_64, "libcuda.so.1", "/usr/lib/nvidia/current/libcuda.so.1")])
    )
    (root / "etc/ld.so.cache").symlink_to("/var/cache/ldconfig/ld.so.cache")
    assert [e.path for e in ldcache.read_cache(root, "x86_64") or ()] == ["/usr/lib/nvidia/current/libcuda.so.1"]


@pytest.mark.parametrize(
    "data",
    [b"", b"not a cache at all", ldcache.OLD_MAGIC + b"\0" + struct.pack("<I", 1000), ldcache.NEW_MAGIC + b"\0" * 8],
    ids=["empty", "garbage", "old-cut-short", "new-cut-short"],
)
def test_a_damaged_cache_is_an_error_and_read_cache_treats_it_as_none(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(ldcache.LdCacheError):
        ldcache.parse(data)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(data)
    assert ldcache.read_cache(tmp_path) is None


def test_conf_dirs_follow_includes_relative_to_the_including_file_and_stop_at_loops(tmp_path: Path) -> None:
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("/opt/first\ninclude ld.so.conf.d/*.conf\ninclude /etc/ld.so.conf\n")
    (tmp_path / "etc/ld.so.conf.d/b.conf").write_text("/usr/local/nvidia/lib64 # the driver\n")
    (tmp_path / "etc/ld.so.conf.d/a.conf").write_text("/opt/a, /opt/a2\nhwcap 0 nosegneg\n")
    assert ldcache.conf_dirs(tmp_path) == (
        PurePosixPath("/opt/first"),
        PurePosixPath("/opt/a"),
        PurePosixPath("/opt/a2"),
        PurePosixPath("/usr/local/nvidia/lib64"),
    )
    assert ldcache.conf_dirs(tmp_path / "nowhere") == ()


def test_a_root_whose_path_has_glob_characters_still_follows_includes(tmp_path: Path) -> None:
    root = tmp_path / "root[1]"
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text("/usr/local/nvidia/lib64\n")
    assert ldcache.conf_dirs(root) == (PurePosixPath("/usr/local/nvidia/lib64"),)
