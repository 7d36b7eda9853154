"""Entry point of the ``dradriver`` command (also installed as ``kubectl-dradriver``).

Exit status, for scripts: 0 success; 1 only when ``explain`` finds that a claim does not fit (or ``demo``'s claim
does not), or ``doctor`` finds a failing check; 2 invalid input or configuration (one line naming the input, the
field and the fix); 70 an unexpected internal error (one line; ``--debug`` shows the traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

from dradriver import __version__
from dradriver.cli.flags.env import resolve_env_values
from dradriver.errors import DradriverError

Handler = Callable[[argparse.Namespace], int]

# Exit code for invalid input or an unusable environment, as argparse uses for bad flags.
EXIT_USAGE = 2
# BSD sysexits' EX_SOFTWARE: a bug of ours, not the user's input.
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (like every other invalid input) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# Every command, its module and its line in ``--help``. Only the module of the command being run is imported
# (argparse needs no other command's options to parse a command line), so ``dradriver run`` never loads the CEL
# and allocator code that ``explain`` and ``demo`` need: start-up time, docs/reliability.md.
COMMANDS: dict[str, tuple[str, str]] = {
    "cd-controller": ("dradriver.cli.cd_controller", "run the ComputeDomain controller (a Deployment)"),
    "cd-daemon": ("dradriver.cli.cd_daemon", "run or probe a ComputeDomain's IMEX daemon (in its DaemonSet pods)"),
    "convert": (
        "dradriver.cli.convert",
        "print DRA objects for NVIDIA device plugin config and workloads that ask for nvidia.com/gpu limits",
    ),
    "demo": ("dradriver.cli.demo", "run the whole driver on a simulated node, without a cluster"),
    "doctor": ("dradriver.cli.doctor", "check this node for the driver: NVML, driver files, CDI, runtime, kubelet"),
    "inventory": ("dradriver.cli.inventory", "list this node's GPUs and MIG devices"),
    "node-labels": (
        "dradriver.cli.node_labels",
        "show GPU Feature Discovery's labels for this node, or remove those the driver wrote from nodes",
    ),
    "explain": ("dradriver.cli.explain", "explain whether ResourceClaims fit a node's devices, and why not"),
    "run": ("dradriver.cli.run", "run the kubelet plugin (the DaemonSet entry point)"),
    "sim": (
        "dradriver.cli.sim",
        "change a simulated node's hardware state (MIG, compute mode, faults), like nvidia-smi",
    ),
    "top": ("dradriver.cli.top", "show which pod holds which GPU on a node, and how busy it is"),
}


def build_parser(commands: Collection[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The parser of the whole command line; of the commands, only those in ``commands`` get their options."""
    parser = Parser(
        prog=_program_name(),
        description="Kubernetes DRA driver for NVIDIA GPUs: discover, publish, prepare, explain.",
        epilog="exit status: 0 success, 1 a claim does not fit (explain) or a check failed (doctor), 2 invalid input "
        "or configuration, 70 internal error (rerun with --debug)",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    subcommands.required = True
    for name, (module, help_line) in COMMANDS.items():
        subparser = subcommands.add_parser(name, help=help_line)
        if name in commands:
            importlib.import_module(module).register(subparser)
    return parser


def _command_of(arguments: Sequence[str]) -> str | None:
    """The command named on the line: the first argument that is not an option (the top-level options take no
    value). None when there is none; an unknown name is left to argparse to report."""
    return next((a for a in arguments if not a.startswith("-")), None)


def _program_name() -> str:
    # `kubectl dradriver` runs the kubectl-dradriver script: name it as the user typed it.
    return "kubectl dradriver" if os.path.basename(sys.argv[0]).startswith("kubectl-") else "dradriver"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every outcome is an exit status, never a traceback (unless ``--debug``)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere on the line, and known before parsing so that it covers parsing too.
    debug = "--debug" in arguments
    arguments = [a for a in arguments if a != "--debug"]
    command = "dradriver"
    try:
        named = _command_of(arguments)
        parser = build_parser((named,) if named else ())
        args = parser.parse_args(arguments)
        command = f"{parser.prog} {args.command}"
        resolve_env_values(args)
        handler: Handler = args.handler
        return handler(args)
    except DradriverError as err:
        print(f"{command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`dradriver … | head`): stop quietly, as other command-line tools do.
        _quiet_stdout()
        return 0
    except SystemExit as exit_:
        # argparse's own exits (--help, --version, a bad flag) and sys.exit() calls become the return value.
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else EXIT_USAGE)
    except Exception as err:
        if debug:
            traceback.print_exc()
        print(
            f"{command}: internal error: {type(err).__name__}: {_first_line(err)}; "
            "rerun with --debug for the traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return text if text else type(err).__name__


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:300] if lines else "(no message)"


def _quiet_stdout() -> None:
    # Point stdout at /dev/null so the interpreter's final flush does not report the broken pipe again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
