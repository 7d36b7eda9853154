"""The value types the flags share (argparse ``type=`` functions) and the checks of the paths they name."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable
from pathlib import Path

from dradriver.errors import ConfigError
from dradriver.inputs import path_exists
from dradriver.validation.names import is_dns_subdomain


def command_line(text: str) -> tuple[str, ...]:
    """A command split like a shell line (``shlex.split``): ``nsenter --target 1 -- systemd-run`` → its words."""
    try:
        return tuple(shlex.split(text))
    except ValueError as err:  # an unclosed quote, a trailing backslash
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a command split like a shell line: {str(err).lower()}"
        ) from None


def interval_seconds(text: str) -> float:
    """A period in seconds: 0 (never) or at least one second, finite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value != 0 and not (1 <= value <= 86400 * 7):
        raise argparse.ArgumentTypeError(f"{text!r}: use 0 (never) or a number of seconds from 1 to 604800")
    return value


def seconds_or_forever(value: str) -> float:
    """A wait in seconds, 0 or more, or ``forever`` (also ``inf``)."""
    if value.strip().lower() in ("inf", "infinity", "forever"):
        return float("inf")
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (or 'forever')") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be 0 or more seconds (or 'forever')")
    return seconds


def non_negative_float(text: str) -> float:
    """A finite number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: use a finite number, 0 or more")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: use a finite number of seconds above 0")
    return value


def positive_int(text: str) -> int:
    """A whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: use a whole number, 1 or more")
    return value


def dns_subdomain(what: str, max_length: int = 253) -> Callable[[str], str]:
    """An argparse type for a Kubernetes name (a DNS subdomain) such as a node or driver name."""

    def check(text: str) -> str:
        if not is_dns_subdomain(text, max_length=max_length):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a valid {what}: use lower-case letters, digits, '-' and '.', "
                f"starting and ending with a letter or digit, at most {max_length} characters"
            )
        return text

    check.__name__ = what  # argparse names the type in some messages
    return check


def check_writable_dir(flag: str, path: Path) -> None:
    """``path`` is a writable directory, or can be created as one."""
    existing = path
    while not path_exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {path}: {existing} is not a directory; point {flag} at a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            raise ConfigError(
                f"{flag} {path}: {existing} is on a read-only filesystem; mount it read-write (in the DaemonSet: "
                "a hostPath volume without readOnly)"
            )
        raise ConfigError(f"{flag} {path}: {existing} is not writable by this process; fix its permissions")


def check_writable_file(flag: str, path: Path) -> None:
    """``path`` is a regular file, or none, in a directory :func:`check_writable_dir` accepts."""
    if path_exists(path) and not path.is_file():
        raise ConfigError(f"{flag} {path}: not a regular file; point {flag} at a file")
    check_writable_dir(f"{flag}'s directory", path.parent)
