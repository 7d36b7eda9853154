"""NVML loaded from the file discovery found, not by soname through this process's loader (issue 22)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dradriver.gpu.errors import LibraryNotFound
from dradriver.gpu.nvml import NvmlGpuLib

STUB = """
int nvmlInitWithFlags(unsigned flags) { (void)flags; return 0; }
int nvmlShutdown(void) { return 0; }
"""


def private_pynvml() -> ModuleType:
    """A fresh copy of pynvml, so the library it holds is this test's alone."""
    import pynvml

    name = "test_private_pynvml"
    spec = importlib.util.spec_from_file_location(name, pynvml.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml looks itself up while it builds its error classes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs cc to build a stub libnvidia-ml")
def test_nvml_is_loaded_from_the_given_file(tmp_path: Path) -> None:
    (tmp_path / "stub.c").write_text(STUB)
    library = tmp_path / "usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04"
    library.parent.mkdir(parents=True)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(library), str(tmp_path / "stub.c")],
        check=True,
        capture_output=True,
    )
    nvml = private_pynvml()
    gpulib = NvmlGpuLib(nvml=nvml, library_path=str(library))
    try:
        assert nvml.nvmlLib._name == str(library)
    finally:
        gpulib.close()


def test_a_library_that_cannot_be_loaded_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(LibraryNotFound, match=r"cannot load NVML from .*nowhere.*--driver-root"):
        NvmlGpuLib(nvml=private_pynvml(), library_path=str(tmp_path / "nowhere/libnvidia-ml.so.1"))


def test_a_library_kernel_mismatch_after_an_in_place_upgrade_says_what_to_do() -> None:
    from dradriver.gpu.errors import error_for_code

    err = error_for_code(18, "RM has detected an NVML/RM version mismatch.", call="nvmlInit")
    assert err.code == 18 and "upgraded in place" in str(err) and "restart this pod" in str(err)
