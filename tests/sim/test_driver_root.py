"""The simulated node's stub driver root: laid out like an installed driver, safe to write again."""

import os
from pathlib import Path

from dradriver.sim.driver_root import STUB_BINARIES, write_stub_driver_root

VERSION = "580.65.06"


def test_libraries_carry_the_version_with_soname_links_and_binaries_are_executable(tmp_path: Path):
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="aarch64")
    libdir = root / "usr/lib/aarch64-linux-gnu"
    assert (libdir / f"libcuda.so.{VERSION}").is_file()
    assert os.readlink(libdir / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert os.readlink(libdir / "libnvidia-nvvm.so.4") == f"libnvidia-nvvm.so.{VERSION}"
    for name in STUB_BINARIES:
        assert (root / "usr/bin" / name).stat().st_mode & 0o111
    assert list((root / "lib/firmware/nvidia" / VERSION).glob("gsp*.bin"))


def test_writing_the_stub_root_again_is_harmless(tmp_path: Path):
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="x86_64")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    write_stub_driver_root(root, VERSION, machine="x86_64")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
