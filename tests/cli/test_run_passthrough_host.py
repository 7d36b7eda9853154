"""`run --passthrough true` on a real node stops at start where the host's sysfs or /proc is not where it reads
them: every claim would be refused later (#38)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.flags.passthrough import PassthroughOptions
from dradriver.cli.main import build_parser
from dradriver.cli.run_assembly import host_pci
from dradriver.errors import ConfigError


def run_options(host_root: Path) -> Any:
    """The part of `run`'s options host_pci reads, parsed from `run`'s command line."""
    args = build_parser(["run"]).parse_args(
        ["run", "--gpu-backend", "nvml", "--passthrough", "true", "--passthrough-host-root", str(host_root)]
    )
    resolve_env_values(args)
    return SimpleNamespace(passthrough=PassthroughOptions.from_args(args))


def host(tmp_path: Path, *, proc: bool) -> Path:
    (tmp_path / "sys/kernel/iommu_groups/20/devices").mkdir(parents=True)
    (tmp_path / "proc").mkdir()  # the mount point, as the chart's pod has it with or without the volume
    if proc:
        (tmp_path / "proc/1").mkdir()
    return tmp_path


def test_a_host_proc_with_processes_is_taken(tmp_path: Path) -> None:
    assert host_pci(run_options(host(tmp_path, proc=True)), None).root == tmp_path


def test_no_host_proc_stops_start_naming_the_mount(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"proc lists no process.*host-proc volume at /host/proc"):
        host_pci(run_options(host(tmp_path, proc=False)), None)
