"""``--gpu-backend``, ``--sim-profile``, ``--sim-state``, ``--mig-mode``: which GPUs, and how MIG is published."""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import check_writable_file
from dradriver.errors import ConfigError
from dradriver.gpu.backend import open_gpu_backend, sim_profile_name
from dradriver.gpu.inventory import MigMode
from dradriver.inputs import path_exists

if TYPE_CHECKING:
    from dradriver.gpu.backend import OpenedBackend

GPU_BACKEND = EnvFlag(
    flag="--gpu-backend",
    env="DRADRIVER_GPU_BACKEND",
    default="nvml",
    choices=("nvml", "sim"),
    help="where GPUs come from: NVML, or a simulated node",
)
SIM_PROFILE = EnvFlag(
    flag="--sim-profile",
    env="DRADRIVER_SIM_PROFILE",
    default="dgx-a100-80gb",
    metavar="NAME|FILE",
    help="simulated node: a built-in profile name or a profile file",
)
SIM_STATE = EnvFlag(
    flag="--sim-state",
    env="DRADRIVER_SIM_STATE",
    metavar="PATH",
    help="JSON file holding simulated hardware state (MIG instances, compute modes) across restarts; in memory "
    "when unset",
)
MIG_MODE = EnvFlag(
    flag="--mig-mode",
    env="DRADRIVER_MIG_MODE",
    default="static",
    choices=("none", "static", "dynamic"),
    help="publish whole GPUs only, existing MIG devices, or every MIG profile x placement",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The GPU discovery flags, in a group of their own."""
    group = parser.add_argument_group("GPU discovery")
    for flag in (GPU_BACKEND, SIM_PROFILE, SIM_STATE, MIG_MODE):
        flag.add(group)


@dataclass(frozen=True, kw_only=True)
class GpuOptions:
    """The backend ("nvml" or "sim"), the simulated node's profile and state file, and the MIG mode."""

    backend: str = "nvml"
    sim_profile: str = "dgx-a100-80gb"
    sim_state: Path | None = None
    mig_mode: MigMode = MigMode.STATIC

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GpuOptions:
        state = SIM_STATE.value(args)
        return cls(
            backend=GPU_BACKEND.value(args),
            sim_profile=SIM_PROFILE.value(args),
            sim_state=Path(state) if state else None,
            mig_mode=MigMode(MIG_MODE.value(args)),
        )

    def check(self) -> None:
        """A simulated node's profile exists and loads, and its state file is a regular file (or none) in a
        writable directory: refused before the node starts, writing nothing (:meth:`probe_state` writes)."""
        if self.backend == "sim":
            sim_profile_name(self.sim_profile)  # a ConfigError naming the profile and the built-in ones
        if self.sim_state is not None:
            check_writable_file(SIM_STATE.flag, self.sim_state)

    def probe_state(self) -> None:
        """The state file can be written where it is to be: a file made and removed at once where the first one
        will be, since permissions do not tell (root may write anywhere, yet /proc takes no file). A ConfigError
        naming --sim-state if not; nothing with no state file."""
        if self.sim_state is None:
            return
        where = self.sim_state.parent
        while not path_exists(where) and where != where.parent:
            where = where.parent  # the node makes the missing directories, from here
        try:
            fd, probe = tempfile.mkstemp(prefix=".dradriver-probe-", dir=where)
        except OSError as err:
            raise unwritable_state(self.sim_state, err) from None
        os.close(fd)
        os.unlink(probe)

    def open_backend(self, *, node_name: str, nvml_library: str | None = None) -> OpenedBackend:
        """The GPU backend these options name, open, and the simulated node behind it (None on NVML); a simulated
        node keeps its state in the state file, and a state file that cannot be written is the ConfigError naming
        --sim-state (``nvml_library``: see :func:`~dradriver.gpu.backend.open_gpu_backend`)."""
        try:
            return open_gpu_backend(
                self.backend,
                sim_profile=self.sim_profile,
                node_name=node_name,
                sim_state=self.sim_state,
                nvml_library=nvml_library,
            )
        except OSError as err:
            if self.sim_state is None:
                raise
            raise unwritable_state(self.sim_state, err) from None


def unwritable_state(state: Path, err: OSError) -> ConfigError:
    """The error for a simulated node's --sim-state file that cannot be written (here, so that `run` on real
    GPUs never imports the simulator's command)."""
    return ConfigError(
        f"--sim-state {state}: cannot write the state file ({err.strerror or err}); "
        "point --sim-state at a file in a writable directory"
    )
