"""The one rule for tests of a real component or tool: a build of scripts/build-* (the control plane, the node,
helm, the image, NVIDIA's CDI hook, the biarch glibc), podman, root, the right to mount, cc.

Without it a test skips, saying what is missing and how to get it. Where the suite demands its components it
fails instead, with the same message: ``DRADRIVER_REQUIRE_ALL=1`` (scripts/test, hence CI, sets it) demands every
one; ``DRADRIVER_REQUIRE_CLUSTER=1`` (the control plane, the older API servers, helm, the image) and
``DRADRIVER_REQUIRE_NODE=1`` (the real node) still demand their tier's. A real GPU is not such a component: the
``gpu`` tests skip wherever there is none. See docs/development.md."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ALL = "DRADRIVER_REQUIRE_ALL"
CLUSTER = "DRADRIVER_REQUIRE_CLUSTER"
NODE = "DRADRIVER_REQUIRE_NODE"


def demanding(tier: str | None = None) -> str | None:
    """The variable that makes a missing component fail here (ALL, else ``tier``'s own), or None."""
    for variable in (ALL, tier):
        if variable and os.environ.get(variable):
            return variable
    return None


def need(what: str, why: str, fix: str, *, tier: str | None = None) -> NoReturn:
    """Stop the test for want of ``what``: ``why`` says what needs it (or what was found instead), ``fix`` how to
    get it. A skip, or a failure where :func:`demanding` names a variable that is set."""
    message = f"missing {what} ({why}); {fix}"
    variable = demanding(tier)
    if variable:
        pytest.fail(f"{message} [{variable} is set: a missing component fails the suite]", pytrace=False)
    pytest.skip(message)


def need_tools(tools: list[str], why: str, fix: str, *, tier: str | None = None) -> None:
    """:func:`need` the ``tools`` found missing, all named in one message; nothing when there are none."""
    if tools:
        need(", ".join(tools), why, fix, tier=tier)


def built_by(script: Path, *, dir_env: str, name: str) -> Path:
    """Where the build ``script`` (scripts/build-*) puts its binary: ``name`` in the directory ``$dir_env`` names when
    set, else the path ``script --print`` says. Whether it is there is the caller's to check (``need``)."""
    override = os.environ.get(dir_env)
    if override:
        return Path(override) / name
    out = subprocess.run(["bash", str(script), "--print"], capture_output=True, text=True, check=True, timeout=30)
    return Path(out.stdout.strip())


def named_or_built(script: Path, *, env: str) -> str:
    """The binary ``$env`` names, else the path the build ``script`` (scripts/build-*) says with ``--print``. Whether
    it is there is the caller's to check (``need``)."""
    return (
        os.environ.get(env)
        or subprocess.run(
            [str(script), "--print"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    )
