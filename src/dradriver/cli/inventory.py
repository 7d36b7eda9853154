"""``dradriver inventory``: print the node's devices as discovery sees them."""

from __future__ import annotations

import argparse
from typing import Any

from dradriver.cli.options import add_gpu_options, add_output_option


def register(subcommands: Any) -> None:
    parser: argparse.ArgumentParser = subcommands.add_parser(
        "inventory", help="list this node's GPUs and MIG partitions",
        description="Discover GPUs (NVML or a simulated node) and print them.")
    add_gpu_options(parser)
    add_output_option(parser, ("table", "json", "yaml"), "table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("inventory is being written")
