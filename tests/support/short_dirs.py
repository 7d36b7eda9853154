"""Directories short enough to hold unix sockets: pytest's ``tmp_path`` can pass the 107-byte limit of a socket's
path (sun_path), so whatever binds a socket below its directory gets one of these instead."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def short_dir(prefix: str) -> Iterator[Path]:
    """A new directory ``/tmp/<prefix>XXXXXXXX``, removed with whatever is in it when the block ends."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
