"""Host-managed IMEX (``--imex-mode hostManaged``): ComputeDomains served by the IMEX daemon the host already runs.

In this mode, as with NVIDIA's ``HostManagedIMEXDaemon`` gate and its ``imex.mode=hostManaged``, the cluster's admin
runs ``nvidia-imex`` on every node as a host service (one IMEX domain per NVLink clique, configured by the admin),
and the driver starts no daemon per ComputeDomain: a channel claim's prepare labels no Node (so the domain's
DaemonSet lands nowhere), asks the host daemon's state with ``nvidia-imex-ctl -q --u=<socket>`` and hands the claim
channel 0 once it answers ``READY``. What is given up: every job on a clique shares the host's domain and channel 0,
so jobs are not isolated from one another's IMEX memory exports (docs/computedomains.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

DRIVER_MANAGED = "driverManaged"
HOST_MANAGED = "hostManaged"
IMEX_MODES = (DRIVER_MANAGED, HOST_MANAGED)
#: Where the host's daemon serves its control socket (NVIDIA's default; IMEX_CMD_UNIX_DOMAIN_PATH in its config).
DEFAULT_HOST_SOCKET = "/etc/nvidia-imex/imex_ctrl.sock"
READY = "READY"


@dataclass(frozen=True)
class HostImexState:
    """What ``nvidia-imex-ctl -q`` said: ``ready`` when it answered READY; ``detail`` is its output or failure."""

    ready: bool
    detail: str


class HostImex:
    """The host's IMEX daemon, asked through its control tool (``ctl``: the command line of ``nvidia-imex-ctl``,
    e.g. ``chroot <driver root> nvidia-imex-ctl`` on a real node, the stand-in's on a simulated one)."""

    def __init__(self, ctl: Sequence[str], socket_path: str = DEFAULT_HOST_SOCKET, *, timeout: float = 10.0) -> None:
        self.ctl = list(ctl)
        self.socket_path = socket_path
        self.timeout = timeout

    def command(self) -> list[str]:
        return [*self.ctl, "-q", f"--u={self.socket_path}"]

    def state(self) -> HostImexState:
        """Ask once (never waits for readiness: a channel prepare that finds it not ready is retried by the
        kubelet)."""
        try:
            done = subprocess.run(self.command(), capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return HostImexState(False, f"running {' '.join(self.command())}: {err}")
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            return HostImexState(False, f"{' '.join(self.command())} exited {done.returncode}: {output}")
        # Exactly READY: a substring test would take NOT_READY for ready.
        return HostImexState(done.stdout.strip() == READY, output)

    def not_ready_message(self, node: str, state: HostImexState) -> str:
        """Why a channel is withheld, and what to check."""
        return (
            f"the host's IMEX daemon on node {node} is not READY ({state.detail}); with --imex-mode hostManaged the "
            f"node's nvidia-imex service must run with IMEX_CMD_ENABLED=1 and IMEX_CMD_UNIX_DOMAIN_PATH="
            f"{self.socket_path}; the kubelet retries (the pod stays in ContainerCreating)"
        )
