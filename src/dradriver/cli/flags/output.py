"""``-o``/``--output``: the format a command prints in."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_output_option(parser: argparse.ArgumentParser, choices: Sequence[str], default: str) -> None:
    """``-o FORMAT`` among ``choices`` (not read from the environment: a format is chosen per call)."""
    parser.add_argument(
        "-o", "--output", choices=list(choices), default=default, help=f"output format (default: {default})"
    )
