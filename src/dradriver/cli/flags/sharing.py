"""``--gpu-sharing``, ``--consumable-shares`` and the MPS flags: how claims share a GPU (docs/sharing.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import command_line
from dradriver.errors import ConfigError
from dradriver.quantity import parse_quantity


def shm_size(value: str) -> int:
    """--mps-shm-size: a Kubernetes quantity of at least 1Mi, in bytes."""
    size = parse_quantity(value)
    if size is None or size < 1024 * 1024:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size of at least 1Mi (e.g. 64Mi, 2Gi)")
    return int(size)


GPU_SHARING = EnvFlag(
    flag="--gpu-sharing",
    env="DRADRIVER_GPU_SHARING",
    default="exclusive",
    choices=("exclusive", "consumable"),
    help="publish whole GPUs for one claim each, or as consumable capacity (memory, shares) that several "
    "claims share, each limited by its own MPS daemon (KEP-5075, Kubernetes 1.34+ DRAConsumableCapacity)",
)
CONSUMABLE_SHARES = EnvFlag(
    flag="--consumable-shares",
    env="DRADRIVER_CONSUMABLE_SHARES",
    metavar="memory|unlimited|N",
    help="NVIDIA's consumable shares: whole GPUs and MIG devices (static MIG) shared by claims (KEP-5075), "
    "each claim taking memory (memory: by default all of it; unlimited: none unless asked) or one of N shares; "
    "each claim's config chooses MPS (limits from what it took), TimeSlicing or nothing (docs/sharing.md)",
)
MPS_CONTROL_COMMAND = EnvFlag(
    flag="--mps-control-command",
    env="DRADRIVER_MPS_CONTROL_COMMAND",
    type=command_line,
    metavar="COMMAND",
    help="the MPS control command, split like a shell line (default: nvidia-cuda-mps-control, or the simulated "
    "node's stand-in with --gpu-backend sim); claims with MPS get one daemon each, started with -f",
)
MPS_DAEMON_WRAPPER = EnvFlag(
    flag="--mps-daemon-wrapper",
    env="DRADRIVER_MPS_DAEMON_WRAPPER",
    type=command_line,
    metavar="COMMAND",
    help="put before the MPS control command when a claim's daemon starts (not for control calls): a command "
    "that takes the daemon out of this container, so a plugin restart or update leaves it serving, and then "
    "execs it; the chart's is 'nsenter --target 1 --mount --uts --ipc --net -- systemd-run --scope --quiet "
    "--collect --slice=dradriver-mps.slice --' (needs hostPID: true; docs/sharing.md)",
)
MPS_SHM_SIZE = EnvFlag(
    flag="--mps-shm-size",
    env="DRADRIVER_MPS_SHM_SIZE",
    type=shm_size,
    metavar="QUANTITY",
    help="the size limit of each MPS claim's shared-memory tmpfs, the /dev/shm of its daemon and its containers "
    "(default: half the node's memory, as a tmpfs's and NVIDIA's; docs/sharing.md)",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """How GPUs are shared, and how a claim's MPS daemon is started."""
    for flag in (GPU_SHARING, CONSUMABLE_SHARES, MPS_CONTROL_COMMAND, MPS_DAEMON_WRAPPER, MPS_SHM_SIZE):
        flag.add(parser)


@dataclass(frozen=True, kw_only=True)
class SharingOptions:
    """``gpu_sharing`` ("exclusive" or "consumable"), NVIDIA's ``consumable_shares`` (None: off), the MPS control
    command as given (empty: the driver's or the stand-in's), the daemon's wrapper (empty: none) and the size of
    each MPS claim's /dev/shm (None: the tmpfs default)."""

    gpu_sharing: str = "exclusive"
    consumable_shares: str | None = None
    mps_control_command: tuple[str, ...] = ()
    mps_daemon_wrapper: tuple[str, ...] = ()
    mps_shm_size: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SharingOptions:
        return cls(
            gpu_sharing=GPU_SHARING.value(args),
            consumable_shares=CONSUMABLE_SHARES.value(args) or None,
            mps_control_command=MPS_CONTROL_COMMAND.value(args) or (),
            mps_daemon_wrapper=MPS_DAEMON_WRAPPER.value(args) or (),
            mps_shm_size=MPS_SHM_SIZE.value(args),
        )

    def check(self) -> None:
        """A consumable-shares value the slices can carry, and only one way of sharing."""
        from dradriver.driver.publish.slices import check_consumable_shares

        if self.consumable_shares:
            check_consumable_shares(self.consumable_shares)
            if self.gpu_sharing == "consumable":
                raise ConfigError(
                    "--consumable-shares and --gpu-sharing consumable are two ways to share GPUs; choose one "
                    "(--gpu-sharing consumable: always MPS, compute shares in percent)"
                )
