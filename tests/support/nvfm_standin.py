"""Fabric Manager behind a stand-in of its client library: ``tests/gpu/nvfm_standin/libnvfm_standin.c`` built with
the system's C compiler, its partition table and call log in files, and FM's unix socket (bound, so it is one).

A library once loaded stays in its process with its state (``fmLibInit``'s): every test gets a copy of its own (a
file dlopen has not seen), so tests pass alone and in any order."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from support import required

SOURCE = Path(__file__).parents[1] / "gpu/nvfm_standin/libnvfm_standin.c"
#: hgx-h100-80gb's GPUs (the simulated HGX board, module ids 1..8 in PCI order), as FM spells a PCI address.
HGX_BUSES = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")


def build(directory: Path) -> Path:
    """Compile the stand-in into ``directory`` (skipped, or failed where the suite demands it, without cc)."""
    if shutil.which("cc") is None:
        required.need("cc", "the test builds a stand-in libnvfm", "apt-get install gcc (`scripts/test` does)")
    library = directory / "libnvfm.so.1"
    subprocess.run(
        ["cc", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libnvfm.so.1", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return library


def fm_bus_id(bus: str) -> str:
    """``00000000:1B:00.0``: a GPU's PCI address as FM (and NVML) report it."""
    return f"00000000:{bus}:00.0"


def hgx_table(buses: Sequence[str] = HGX_BUSES) -> list[str]:
    """FM's partitions of an HGX baseboard (all GPUs, halves, quarters, … one each), ids in that order."""
    gpus = [f"{i + 1},{fm_bus_id(bus)},GPU-{i + 1:08d}-0000-0000-0000-000000000000" for i, bus in enumerate(buses)]
    lines, size = [], len(gpus)
    while size >= 1:
        for start in range(0, len(gpus), size):
            lines.append(f"partition {len(lines)} 0 {' '.join(gpus[start : start + size])}")
        size //= 2
    return lines


class FmStandin:
    """The stand-in's files: ``library`` (this test's copy), ``table``, ``log``, and FM's unix ``socket``."""

    def __init__(self, directory: Path, built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.library = directory / "libnvfm.so.1"
        shutil.copyfile(built, self.library)
        self.table = directory / "fm-table"
        self.log = directory / "fm-calls"
        self.socket = directory / "fm.sock"
        monkeypatch.setenv("NVFM_STANDIN_TABLE", str(self.table))
        monkeypatch.setenv("NVFM_STANDIN_LOG", str(self.log))
        self.write(hgx_table())

    def write(self, lines: Sequence[str]) -> None:
        self.table.write_text("".join(f"{line}\n" for line in lines))

    def add(self, *lines: str) -> None:
        self.write([*self.table.read_text().splitlines(), *lines])

    def active(self) -> list[int]:
        """The partitions the fabric holds active (the table FM keeps)."""
        fields = [line.split() for line in self.table.read_text().splitlines() if line.startswith("partition ")]
        return [int(f[1]) for f in fields if f[2] == "1"]

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def listening(self) -> contextlib.AbstractContextManager[Path]:
        """FM's socket bound at ``self.socket`` while the context lasts."""
        return bound_socket(self.socket)


@contextlib.contextmanager
def bound_socket(path: Path) -> Iterator[Path]:
    """A unix socket bound at ``path`` (what Fabric Manager listens on) while the context lasts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        yield path
