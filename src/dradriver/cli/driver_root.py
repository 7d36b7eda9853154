"""The driver-root helpers ``doctor`` imports from here, over parsed arguments; new code reads the group,
:class:`~dradriver.cli.flags.driver_root.DriverRootOptions`, instead."""

from __future__ import annotations

import argparse

from dradriver.cli.flags import driver_root
from dradriver.cli.flags.driver_root import DriverRootOptions
from dradriver.cli.flags.gpus import GPU_BACKEND
from dradriver.cli.flags.node_dirs import plugin_dir_of

__all__ = ["add_driver_root_options", "nvml_library_for", "plugin_dir_of"]


def add_driver_root_options(parser: argparse.ArgumentParser) -> None:
    """--driver-root, --container-driver-root, --nvidia-cdi-hook-path and --cdi-hook-source
    (:func:`dradriver.cli.flags.driver_root.add_flags`)."""
    driver_root.add_flags(parser)


def nvml_library_for(args: argparse.Namespace) -> str | None:
    """:meth:`DriverRootOptions.nvml_library` for ``args``."""
    return DriverRootOptions.from_args(args).nvml_library(GPU_BACKEND.value(args))
