"""Shell helpers for the kind e2e suite."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml


def run(*args: str, timeout: float = 300, input: str | None = None) -> str:
    """Run a command, returning its stdout; fail with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def header(path: Path, field: str) -> str | None:
    """An example's ``# Field: value`` header line, or None."""
    match = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    return match.group(1).strip() if match else None


def workloads(path: Path) -> list[dict[str, Any]]:
    """The Pods and Deployments of an example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("Pod", "Deployment")]
