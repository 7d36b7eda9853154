"""Flags also read from an environment variable (``DRADRIVER_*`` and the downward API's), checked like the flag."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dradriver.errors import ConfigError


def env_default(var: str, default: Any = None) -> Any:
    """The value of environment variable ``var`` if set, else ``default``.

    A variable set to the empty string is the flag given ``""`` (``DRADRIVER_METRICS_ADDRESS=""`` turns the
    status server off like ``--metrics-address ""``; ``DRADRIVER_MIG_MODE=""`` is refused like
    ``--mig-mode ""``), as Go drivers' flag libraries read a set variable; unset it to get the default."""
    value = os.environ.get(var)
    return default if value is None else value


@dataclass(frozen=True)
class EnvValue:
    """A flag's value taken from its environment variable, checked only once its subcommand runs.

    Kept unchecked while the parser is built, so that a variable for one subcommand (``DRADRIVER_MIG_MODE``
    in a DaemonSet) cannot break another, ``--version`` or ``--help``; :func:`resolve_env_values` then
    checks it exactly as argparse checks the flag, with a message naming the variable."""

    var: str
    raw: str
    flag: str
    type: Callable[[str], Any] | None
    choices: tuple[str, ...] | None

    def resolve(self) -> Any:
        try:
            value = self.type(self.raw) if self.type is not None else self.raw
        except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
            detail = str(err) if isinstance(err, argparse.ArgumentTypeError) else "not a valid value"
            raise ConfigError(f"environment variable {self.var}={self.raw!r} (sets {self.flag}): {detail}") from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"environment variable {self.var}={self.raw!r} (sets {self.flag}): "
                f"choose one of {', '.join(self.choices)}"
            )
        return value


def resolve_env_values(args: argparse.Namespace) -> None:
    """Check and convert every flag value that came from the environment (see :class:`EnvValue`)."""
    for name, value in vars(args).items():
        if isinstance(value, EnvValue):
            setattr(args, name, value.resolve())


def add_env_option(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    *,
    env: str | None,
    default: Any = None,
    help: str,
    choices: Sequence[str] | None = None,
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
) -> None:
    """Add ``flag`` whose default comes from ``env`` (then ``default``); the help names the variable. With ``env``
    None the flag alone, its default ``default``.

    ``type`` and ``choices`` check the flag and the variable alike; a ``type`` raising
    ``argparse.ArgumentTypeError`` gives both the same message."""
    shown = f" (default: {default})" if default not in (None, "") else ""
    raw = env_default(env) if env is not None else None
    kwargs: dict[str, Any] = {
        "default": default
        if env is None or raw is None
        else EnvValue(env, raw, flag, type, tuple(choices) if choices is not None else None),
        "help": f"{help}{shown}" + (f" [env {env}]" if env is not None else ""),
    }
    if choices is not None:
        kwargs["choices"] = list(choices)
    if type is not None:
        kwargs["type"] = type
    if metavar is not None:
        kwargs["metavar"] = metavar
    parser.add_argument(flag, **kwargs)


@dataclass(frozen=True, kw_only=True)
class EnvFlag:
    """One flag and its environment variable, declared once by its group and added by every command that takes it.

    A command may word the help, or choose the default, for what it does with the value (``add(parser,
    help=…)``); the name, the variable and the value's type stay the flag's own."""

    flag: str
    env: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value in."""
        return self.flag.removeprefix("--").replace("-", "_")

    def add(
        self,
        parser: argparse.ArgumentParser | Any,
        *,
        help: str | None = None,
        default: Any = None,
        from_env: bool = True,
    ) -> None:
        """Add the flag to ``parser`` (or an argument group), with this command's ``help`` or ``default``; without
        ``from_env``, the flag alone (its variable ignored: for a command that must act only on what its command
        line names)."""
        flag = replace(self, help=help or self.help, default=self.default if default is None else default)
        add_env_option(
            parser,
            flag.flag,
            env=flag.env if from_env else None,
            default=flag.default,
            help=flag.help,
            choices=flag.choices,
            type=flag.type,
            metavar=flag.metavar,
        )

    def value(self, args: argparse.Namespace) -> Any:
        """The parsed value; the flag's default for a command that does not take it."""
        return getattr(args, self.dest, self.default)
