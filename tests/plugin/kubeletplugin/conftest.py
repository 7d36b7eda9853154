"""Fixtures for the kubelet-plugin layer: short socket directories, fake ports, a started plugin."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kubelet_plugin_fakes import DRIVER, FakeClaimSource, FakeHandler
from support.short_dirs import short_dir

from dradriver.plugin.handler import HealthBoard
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with short_dir("dra-") as path:
        yield path


@pytest.fixture
def claims() -> FakeClaimSource:
    return FakeClaimSource()


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler()


@pytest.fixture
def health() -> HealthBoard:
    return HealthBoard()


PluginFactory = Callable[..., KubeletPlugin]
OPTION_FIELDS = {field.name for field in dataclasses.fields(KubeletPluginOptions)}


@pytest.fixture
def make_plugin(
    sock_dir: Path, claims: FakeClaimSource, handler: FakeHandler, health: HealthBoard
) -> Iterator[PluginFactory]:
    """Builds (not starts) plugins with test-friendly intervals; stops them all at teardown."""
    built: list[KubeletPlugin] = []

    def build(**overrides: Any) -> KubeletPlugin:
        """``overrides`` name options (:class:`KubeletPluginOptions` fields) and parts (``handler``, …) alike."""
        parts: dict[str, Any] = {"handler": handler, "claim_source": claims, "health_source": health}
        options: dict[str, Any] = {
            "driver_name": DRIVER,
            "node_name": "node-a",
            "registry_dir": sock_dir / "registry",
            "plugin_dir": sock_dir / "plugin",
            "health_interval": 30.0,
            "registration_check_interval": 0.02,
            "stop_grace": 1.0,
        }
        for name, value in overrides.items():
            (options if name in OPTION_FIELDS else parts)[name] = value
        plugin = KubeletPlugin(KubeletPluginOptions(**options), **parts)
        built.append(plugin)
        return plugin

    yield build
    for plugin in built:
        plugin.stop()


@pytest.fixture
def plugin(make_plugin: PluginFactory) -> KubeletPlugin:
    """A started plugin serving the fake handler, claim source and health board."""
    started = make_plugin()
    started.start()
    return started


@pytest.fixture
def kubelet(sock_dir: Path) -> KubeletClient:
    return KubeletClient(sock_dir / "registry")
