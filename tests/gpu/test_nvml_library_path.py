"""NVML loaded from the file discovery found, not by soname through this process's loader (issue 22)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support import required

from dradriver.gpu.errors import LibraryNotFound
from dradriver.gpu.nvml import NvmlGpuLib

STUB = """
int nvmlInitWithFlags(unsigned flags) { (void)flags; return 0; }
int nvmlShutdown(void) { return 0; }
"""
# Loads the stub in a process of its own: a library once loaded stays in its process, and a later load of
# libnvidia-ml.so.1 by soname there (doctor with no NVML in the driver root) would get the stub.
LOAD_FROM_FILE = """
import sys
import pynvml
from dradriver.gpu.nvml import NvmlGpuLib
gpulib = NvmlGpuLib(nvml=pynvml, library_path=sys.argv[1])
try:
    print(pynvml.nvmlLib._name)
finally:
    gpulib.close()
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


def test_nvml_is_loaded_from_the_given_file(tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        required.need("cc", "the test builds a stub libnvidia-ml", "apt-get install gcc (`scripts/test` does)")
    (tmp_path / "stub.c").write_text(STUB)
    library = tmp_path / "usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04"
    library.parent.mkdir(parents=True)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(library), str(tmp_path / "stub.c")],
        check=True,
        capture_output=True,
    )
    done = subprocess.run([sys.executable, "-c", LOAD_FROM_FILE, str(library)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(library)


def test_a_library_that_cannot_be_loaded_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(LibraryNotFound, match=r"cannot load NVML from .*nowhere.*--driver-root"):
        NvmlGpuLib(nvml=private_pynvml(), library_path=str(tmp_path / "nowhere/libnvidia-ml.so.1"))


def test_a_library_kernel_mismatch_after_an_in_place_upgrade_says_what_to_do() -> None:
    from dradriver.gpu.errors import error_for_code

    err = error_for_code(18, "RM has detected an NVML/RM version mismatch.", call="nvmlInit")
    assert err.code == 18 and "upgraded in place" in str(err) and "restart this pod" in str(err)
