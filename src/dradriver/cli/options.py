"""Flags shared by several subcommands, each also read from a ``DRADRIVER_*`` environment variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any


def env_default(var: str, default: Any = None) -> Any:
    """The value of environment variable ``var`` if set and non-empty, else ``default``."""
    value = os.environ.get(var)
    return value if value not in (None, "") else default


def add_env_option(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    *,
    env: str,
    default: Any = None,
    help: str,
    choices: Sequence[str] | None = None,
    type: Any = None,
    metavar: str | None = None,
) -> None:
    """Add ``flag`` whose default comes from ``env`` (then ``default``); the help names the variable."""
    shown = f" (default: {default})" if default not in (None, "") else ""
    kwargs: dict[str, Any] = {
        "default": env_default(env, default),
        "help": f"{help}{shown} [env {env}]",
    }
    if choices is not None:
        kwargs["choices"] = list(choices)
    if type is not None:
        kwargs["type"] = type
        if isinstance(kwargs["default"], str) and type is not str:
            kwargs["default"] = type(kwargs["default"])
    if metavar is not None:
        kwargs["metavar"] = metavar
    parser.add_argument(flag, **kwargs)


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
        help="DRA driver name (ResourceSlice spec.driver, attribute domain)",
    )
    add_env_option(
        group,
        "--kubernetes-version",
        env="DRADRIVER_KUBERNETES_VERSION",
        default=version_default,
        metavar="1.N",
        help="the cluster's Kubernetes minor version; 1.34 keeps MIG counter sets inline "
        "with devices, 1.35 and newer put them in slices of their own ('dradriver run' reads it from the API "
        "server when unset)",
    )
