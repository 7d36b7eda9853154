"""Entry point of the ``dradriver`` command (also installed as ``kubectl-dradriver``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dradriver import __version__
from dradriver.errors import DradriverError

Handler = Callable[[argparse.Namespace], int]

# Exit code for invalid input or an unusable environment, as argparse uses for bad flags.
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    from dradriver.cli import demo, explain, inventory, run, sim

    parser = argparse.ArgumentParser(
        prog="dradriver",
        description="Kubernetes DRA driver for NVIDIA GPUs: discover, publish, prepare, explain.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    subcommands.required = True
    for module in (demo, inventory, explain, run, sim):
        module.register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except DradriverError as err:
        print(f"dradriver {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`dradriver … | head`): stop quietly, as other command-line tools do.
        sys.stderr.close()
        return 0
