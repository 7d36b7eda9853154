"""Which paths the code under test writes, wherever they are: Python's audit events (a file opened for writing;
rename, mkdir, remove, chmod, ...) seen while a recording is active. A listing of a test's own directory
afterwards cannot show a file written outside it; this can."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# event -> (position of a path argument, position of its dir_fd argument or None), per path it changes
_PATH_ARGUMENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.rename": ((0, 2), (1, 3)),  # os.replace too
    "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.mkdir": ((0, 2),),
    "os.mknod": ((0, 3),),
    "os.remove": ((0, 1),),  # os.unlink too
    "os.rmdir": ((0, 1),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.truncate": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}
_recordings: list[list[Path]] = []


def _absolute(path: Any, dir_fd: Any) -> Path | None:
    """``path`` made absolute (relative to ``dir_fd``'s directory or the working directory), symlinks of what
    exists resolved; None for an open descriptor, whose file was recorded when it was opened."""
    if not isinstance(path, str | bytes | os.PathLike):
        return None
    text = os.fsdecode(os.fspath(path))
    if isinstance(dir_fd, int) and not os.path.isabs(text):
        text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
    return Path(os.path.realpath(text))


def _changed(event: str, args: tuple[Any, ...]) -> list[Path]:
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
        found = _absolute(path, None) if writes else None
        return [found] if found is not None else []
    out = []
    for path_at, dir_fd_at in _PATH_ARGUMENTS.get(event, ()):
        found = _absolute(args[path_at], args[dir_fd_at] if dir_fd_at is not None else None)
        if found is not None:
            out.append(found)
    return out


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _recordings:
        return
    recording = _recordings.pop()  # taken while it runs: the hook's own calls are not recorded
    try:
        # The interpreter caching bytecode of a module imported late is not the code under test writing.
        recording.extend(p for p in _changed(event, args) if p.suffix != ".pyc")
    finally:
        _recordings.append(recording)


@functools.cache
def _install() -> None:
    sys.addaudithook(_audit)


@contextlib.contextmanager
def recorded_writes() -> Iterator[list[Path]]:
    """Yields a list that receives every path written, created, renamed, removed or re-moded (absolute) until
    the block ends. The hook, once added, stays for the process (audit hooks cannot be removed) and does nothing
    outside a recording."""
    _install()
    recording: list[Path] = []
    _recordings.append(recording)
    try:
        yield recording
    finally:
        # By identity: two recordings that saw nothing are equal lists.
        _recordings[:] = [r for r in _recordings if r is not recording]


def outside(paths: list[Path], directory: Path) -> list[Path]:
    """The paths of ``paths`` not under ``directory`` (its symlinks resolved)."""
    root = directory.resolve()
    return [p for p in paths if not p.is_relative_to(root)]
