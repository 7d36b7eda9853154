"""``dradriver cd-daemon run|check``: the IMEX daemon's supervisor in a ComputeDomain's DaemonSet pods."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

from dradriver.cli.flags import kube_client, logs
from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.cli.flags.logs import LogOptions
from dradriver.cli.flags.publishing import COMPAT
from dradriver.cli.flags.values import command_line
from dradriver.cli.stop_signals import StopOnSignals
from dradriver.computedomain.api import names_of
from dradriver.computedomain.daemon import ImexDaemon, local_ready, settings_from_env
from dradriver.computedomain.kube import Rest
from dradriver.errors import ConfigError

HOST_IMEX_SOCKET = "/etc/nvidia-imex/imex_ctrl.sock"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run (run) or probe (check) the IMEX daemon of a ComputeDomain on this node."
    parser.add_argument("action", choices=("run", "check"))
    kube_client.add_flags(parser, rate_limits=False)
    add_env_option(parser, "--config-dir", env="DRADRIVER_IMEX_CONFIG_DIR", default="/imexd",
                   help="where the daemon claim mounted this domain's IMEX files")  # fmt: skip
    add_env_option(parser, "--hosts-file", env="DRADRIVER_HOSTS_FILE", default="/etc/hosts",
                   help="the hosts file that maps peer names to addresses")  # fmt: skip
    add_env_option(parser, "--imex-command", env="DRADRIVER_IMEX_COMMAND", default="nvidia-imex", type=command_line,
                   help="the IMEX daemon, split like a shell line")  # fmt: skip
    add_env_option(parser, "--imex-ctl-command", env="DRADRIVER_IMEX_CTL_COMMAND", default="nvidia-imex-ctl",
                   type=command_line, help="the IMEX control tool, split like a shell line")  # fmt: skip
    add_env_option(parser, "--host-imex-socket", env="DRADRIVER_HOST_IMEX_SOCKET", default=HOST_IMEX_SOCKET,
                   help="a host nvidia-imex service's control socket: refuse to run beside it")  # fmt: skip
    COMPAT.add(parser, help="the controller's --compat, which it passes to its daemons: 'nvidia' writes the cliques "
               "and labels under NVIDIA's group, resource.nvidia.com")  # fmt: skip
    logs.add_flags(parser, level=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_env(
        dict(os.environ),
        config_dir=Path(args.config_dir),
        hosts_file=Path(args.hosts_file),
        imex_command=args.imex_command,
        imex_ctl_command=args.imex_ctl_command,
        names=names_of(COMPAT.value(args)),
    )
    if args.action == "check":
        return 0 if local_ready(settings) else 1
    LogOptions.from_args(args).configure()
    if settings.clique_id and Path(args.host_imex_socket).exists():
        raise ConfigError(
            f"a host nvidia-imex service runs on node {settings.node_name} (its socket {args.host_imex_socket} "
            "exists): two IMEX daemons on one node break each other's domains; stop it for driver-managed "
            "ComputeDomains (systemctl disable --now nvidia-imex.service; systemctl mask nvidia-imex.service)"
        )
    kube = KubeClientOptions.from_args(args)
    kube.check()  # after this node's own checks, as run orders them; before anything starts
    stop = threading.Event()
    rest = Rest(kube.transport())
    try:
        with StopOnSignals(stop):
            ImexDaemon(rest, settings).run(stop)
    finally:
        rest.close()
    return 0
