"""Shell helpers for the kind e2e suite."""

from __future__ import annotations

import subprocess


def run(*args: str, timeout: float = 300, input: str | None = None) -> str:
    """Run a command, returning its stdout; fail with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout
