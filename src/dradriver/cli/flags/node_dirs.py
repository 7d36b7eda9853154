"""``--registry-dir``, ``--plugin-dir``, ``--cdi-dir``, ``--state-dir``: the node's directories a driver uses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import check_writable_dir
from dradriver.errors import ConfigError
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR

REGISTRY_DIR = EnvFlag(
    flag="--registry-dir",
    env="DRADRIVER_REGISTRY_DIR",
    default=str(DEFAULT_REGISTRY_DIR),
    help="kubelet plugin registration directory",
)
PLUGIN_DIR = EnvFlag(
    flag="--plugin-dir",
    env="DRADRIVER_PLUGIN_DIR",
    help=f"directory for the DRA socket and lock (default: {DEFAULT_PLUGINS_DIR}/<driver-name>)",
)
CDI_DIR = EnvFlag(
    flag="--cdi-dir", env="DRADRIVER_CDI_DIR", default="/var/run/cdi", help="where per-claim CDI specs are written"
)
STATE_DIR = EnvFlag(
    flag="--state-dir",
    env="DRADRIVER_STATE_DIR",
    help="where the checkpoint of prepared claims lives (default: the plugin directory); it must survive "
    "plugin restarts but not reboots (a checkpoint from an earlier boot is discarded)",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The kubelet's registration directory, the plugin's own, where CDI specs go and where the checkpoint lives."""
    for flag in (REGISTRY_DIR, PLUGIN_DIR, CDI_DIR, STATE_DIR):
        flag.add(parser)


def plugin_dir_of(args: argparse.Namespace) -> Path:
    """The plugin directory: ``--plugin-dir``, else the kubelet's plugins directory / ``--driver-name``."""
    given = PLUGIN_DIR.value(args)
    return Path(given) if given else DEFAULT_PLUGINS_DIR / args.driver_name


@dataclass(frozen=True, kw_only=True)
class NodeDirs:
    """The directories, defaults resolved for the driver's name; ``named`` are those given (flag, directory),
    which :meth:`check` proves writable (a default is the DaemonSet's, mounted there)."""

    registry: Path
    plugin: Path
    cdi: Path
    state: Path
    named: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, driver_name: str) -> NodeDirs:
        """The directories of ``args``; an empty registration or CDI directory is refused (``Path("")`` is the
        current directory, where neither the kubelet nor the runtime looks)."""
        for flag in (REGISTRY_DIR, CDI_DIR):
            if not flag.value(args):
                raise ConfigError(
                    f"{flag.flag} ({flag.env}) is empty; give a directory, or unset the variable for the default"
                )
        plugin = PLUGIN_DIR.value(args)
        state = STATE_DIR.value(args)
        named = ((f.flag, Path(v)) for f in (REGISTRY_DIR, PLUGIN_DIR, CDI_DIR, STATE_DIR) if (v := f.value(args)))
        return cls(
            registry=Path(REGISTRY_DIR.value(args)),
            plugin=Path(plugin) if plugin else DEFAULT_PLUGINS_DIR / driver_name,
            cdi=Path(CDI_DIR.value(args)),
            state=Path(state or plugin or DEFAULT_PLUGINS_DIR / driver_name),
            named=tuple(named),
        )

    def check(self) -> None:
        """Each directory given is writable, or can be created (refused here, before anything is created)."""
        for flag, path in self.named:
            check_writable_dir(flag, path)
