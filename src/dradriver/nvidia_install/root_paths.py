"""Paths inside a driver root, with symlinks followed inside it as the host would follow them.

The plugin sees the host's driver root through a mount (``/driver-root``), so an absolute link in it
(``/etc/ld.so.conf.d/x86_64-linux-gnu_GL.conf -> /etc/alternatives/…``, ``lib64 -> /usr/lib64``) means the root's
``/``, never the plugin container's. Every file the driver-root discovery reads goes through :func:`resolve`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

#: As the kernel's limit on links followed in one lookup (MAXSYMLINKS): more means a loop.
MAX_LINKS = 40


def resolve(root: Path, relative: PurePosixPath) -> PurePosixPath | None:
    """``relative`` (root-relative) with every symlink followed inside ``root`` (an absolute target is taken from
    the root, ``..`` never leaves it): the root-relative path of what it names, or None when that is missing,
    dangling or a loop."""
    current = PurePosixPath()
    pending = list(reversed(relative.parts))
    links = 0
    while pending:
        part = pending.pop()
        if part in ("", ".", "/"):
            continue
        if part == "..":
            current = current.parent  # every component of current is a real directory: '..' is lexical here
            continue
        candidate = root / current / part
        if candidate.is_symlink():
            links += 1
            if links > MAX_LINKS:
                return None
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                current = PurePosixPath()
            # The target's components are looked up one by one from here, like the rest: a '..' in it or after
            # it applies to where the link leads, not to the link's name.
            pending.extend(reversed(target.parts))
            continue
        current = current / part
    return current if (root / current).exists() else None


def regular_file(root: Path, relative: PurePosixPath) -> PurePosixPath | None:
    """``relative`` resolved inside ``root`` if it ends at a regular file, else None."""
    resolved = resolve(root, relative)
    return resolved if resolved is not None and (root / resolved).is_file() else None


def directory(root: Path, relative: PurePosixPath) -> PurePosixPath | None:
    """``relative`` resolved inside ``root`` if it ends at a directory, else None."""
    resolved = resolve(root, relative)
    return resolved if resolved is not None and (root / resolved).is_dir() else None
