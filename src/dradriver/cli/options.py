"""Flags shared by several subcommands, each also read from a ``DRADRIVER_*`` environment variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.errors import ConfigError
from dradriver.inputs import load_yaml_file, path_exists, type_name
from dradriver.validation.names import is_dns_subdomain


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
    env: str,
    default: Any = None,
    help: str,
    choices: Sequence[str] | None = None,
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
) -> None:
    """Add ``flag`` whose default comes from ``env`` (then ``default``); the help names the variable.

    ``type`` and ``choices`` check the flag and the variable alike; a ``type`` raising
    ``argparse.ArgumentTypeError`` gives both the same message."""
    shown = f" (default: {default})" if default not in (None, "") else ""
    raw = env_default(env)
    kwargs: dict[str, Any] = {
        "default": default
        if raw is None
        else EnvValue(env, raw, flag, type, tuple(choices) if choices is not None else None),
        "help": f"{help}{shown} [env {env}]",
    }
    if choices is not None:
        kwargs["choices"] = list(choices)
    if type is not None:
        kwargs["type"] = type
    if metavar is not None:
        kwargs["metavar"] = metavar
    parser.add_argument(flag, **kwargs)


def interval_seconds(text: str) -> float:
    """A period in seconds: 0 (never) or at least one second, finite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value != 0 and not (1 <= value <= 86400 * 7):
        raise argparse.ArgumentTypeError(f"{text!r}: use 0 (never) or a number of seconds from 1 to 604800")
    return value


def non_negative_float(text: str) -> float:
    """A finite number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: use a finite number, 0 or more")
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


def kubernetes_version(text: str) -> str:
    """A Kubernetes minor version with DRA (1.32 or newer); empty: ask the API server."""
    from dradriver.driver.publish.slices import shape_for

    if text == "":
        return text
    try:
        shape_for(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--kubernetes-version ")) from None
    return text


def check_kubeconfig(flag: str, path: str | None) -> None:
    """Read the kubeconfig files the Kubernetes client will read (``path``, else ``$KUBECONFIG`` or
    ``~/.kube/config`` outside a pod) through the bounded loader first, so that a huge, binary or hostile file
    is refused with one line before the client (which reads files whole) sees it."""
    if path:
        files, source = [Path(path)], flag
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        return  # the in-cluster service account: no file
    elif os.environ.get("KUBECONFIG"):
        files, source = [Path(p) for p in os.environ["KUBECONFIG"].split(os.pathsep) if p], "KUBECONFIG"
    else:
        files, source = [p for p in [Path.home() / ".kube" / "config"] if path_exists(p)], "~/.kube/config"
    for file in files:
        try:
            documents = load_yaml_file(file)
        except ConfigError as err:
            fix = "" if ";" in str(err) else f"; point {source} at a readable kubeconfig file"
            raise ConfigError(f"{source} {err}{fix}") from None
        if len(documents) != 1 or not isinstance(documents[0], dict):
            got = f"{len(documents)} documents" if len(documents) != 1 else type_name(documents[0])
            raise ConfigError(f"{source} {file}: expected one kubeconfig mapping (kind: Config), got {got}")


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
    if path_exists(path) and not path.is_file():
        raise ConfigError(f"{flag} {path}: not a regular file; point {flag} at a file")
    check_writable_dir(f"{flag}'s directory", path.parent)


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """--gpu-backend, --sim-profile, --sim-state and --mig-mode: which GPUs and how MIG is published."""
    group = parser.add_argument_group("GPU discovery")
    add_env_option(
        group,
        "--gpu-backend",
        env="DRADRIVER_GPU_BACKEND",
        default="nvml",
        choices=("nvml", "sim"),
        help="where GPUs come from: NVML, or a simulated node",
    )
    add_env_option(
        group,
        "--sim-profile",
        env="DRADRIVER_SIM_PROFILE",
        default="dgx-a100-80gb",
        metavar="NAME|FILE",
        help="simulated node: a built-in profile name or a profile file",
    )
    add_env_option(
        group,
        "--sim-state",
        env="DRADRIVER_SIM_STATE",
        metavar="PATH",
        help="JSON file holding simulated hardware state (MIG instances, compute modes) "
        "across restarts; in memory when unset",
    )
    add_env_option(
        group,
        "--mig-mode",
        env="DRADRIVER_MIG_MODE",
        default="static",
        choices=("none", "static", "dynamic"),
        help="publish whole GPUs only, existing MIG devices, or every MIG profile x placement",
    )


def add_output_option(parser: argparse.ArgumentParser, choices: Sequence[str], default: str) -> None:
    parser.add_argument(
        "-o", "--output", choices=list(choices), default=default, help=f"output format (default: {default})"
    )


def add_slice_options(parser: argparse.ArgumentParser, *, version_default: str = "1.35") -> None:
    """--driver-name and --kubernetes-version: how ResourceSlices are named and shaped (an empty
    ``version_default`` means: ask the API server)."""
    from dradriver import DEFAULT_DRIVER_NAME

    group = parser.add_argument_group("ResourceSlices")
    add_env_option(
        group,
        "--driver-name",
        env="DRADRIVER_DRIVER_NAME",
        default=DEFAULT_DRIVER_NAME,
        type=dns_subdomain("driver name", 63),
        help="DRA driver name (ResourceSlice spec.driver, attribute domain)",
    )
    add_env_option(
        group,
        "--compat",
        env="DRADRIVER_COMPAT",
        default="none",
        choices=("none", "nvidia"),
        help="publish under another driver's names so its manifests work unedited: 'nvidia' runs as "
        "gpu.nvidia.com, the driver name and attribute domain NVIDIA's DeviceClasses and claims select "
        "(docs/nvidia-compatibility.md)",
    )
    add_env_option(
        group,
        "--kubernetes-version",
        env="DRADRIVER_KUBERNETES_VERSION",
        default=version_default,
        type=kubernetes_version,
        metavar="1.N",
        help="the cluster's Kubernetes minor version (1.32 or newer); up to 1.34 MIG counter sets stay inline "
        "with devices, 1.35 and newer put them in slices of their own ('dradriver run' reads it from the API "
        "server when unset)",
    )


def unwritable_state(state: Path, err: OSError) -> ConfigError:
    """The error for a simulated node's --sim-state file that cannot be written (here, so that `run` on real
    GPUs never imports the simulator's command)."""
    return ConfigError(
        f"--sim-state {state}: cannot write the state file ({err.strerror or err}); "
        "point --sim-state at a file in a writable directory"
    )


def apply_compat(args: argparse.Namespace) -> None:
    """Set ``args.driver_name`` from ``--compat`` (after parsing: the flag and the variable may come in any order)."""
    from dradriver.driver.prepare.presets import preset_driver_name

    args.driver_name = preset_driver_name(args.compat, args.driver_name)
