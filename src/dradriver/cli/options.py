"""The flag helpers ``doctor`` and ``explain`` import from here, from before the flags were grouped by concern in
``cli/flags/``: each is defined by its group there, where new code imports it."""

from __future__ import annotations

import argparse

from dradriver.cli.flags import gpus
from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.output import add_output_option

__all__ = ["add_env_option", "add_gpu_options", "add_output_option"]


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """--gpu-backend, --sim-profile, --sim-state and --mig-mode (:func:`dradriver.cli.flags.gpus.add_flags`)."""
    gpus.add_flags(parser)
