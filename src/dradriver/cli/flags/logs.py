"""``--log-format``, ``--log-level``: how a long-running command logs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.logs import configure_logging

LOG_FORMAT = EnvFlag(
    flag="--log-format", env="DRADRIVER_LOG_FORMAT", default="text", choices=("text", "json"), help="log line format"
)
LOG_LEVEL = EnvFlag(
    flag="--log-level",
    env="DRADRIVER_LOG_LEVEL",
    default="info",
    choices=("debug", "info", "warning", "error"),
    help="log level",
)


def add_flags(parser: argparse.ArgumentParser, *, level: bool = True) -> None:
    """The log format, and (``level``) the level."""
    LOG_FORMAT.add(parser)
    if level:
        LOG_LEVEL.add(parser)


@dataclass(frozen=True, kw_only=True)
class LogOptions:
    format: str = "text"
    level: str = "info"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LogOptions:
        return cls(format=LOG_FORMAT.value(args), level=LOG_LEVEL.value(args))

    def configure(self) -> None:
        """Send every log line to stderr, in this format, from this level up."""
        configure_logging(self.format, self.level)
