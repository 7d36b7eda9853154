"""``dradriver cd-controller``'s settings for the daemon pods it creates."""

from __future__ import annotations

import pytest

from dradriver.cli.cd_controller import daemon_env
from dradriver.errors import ConfigError


def test_daemon_env_takes_kubernetes_env_vars() -> None:
    entries = '[{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]'
    assert daemon_env(entries) == (
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    )
    assert daemon_env("[]") == ()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("A=1", "is not JSON"),
        ('{"name": "A"}', "must be a JSON list"),
        ('[{"value": "1"}]', "--daemon-env[0] has no name"),
        ('[{"name": "A", "value": 1}]', "--daemon-env[0] (A): value must be a string"),
    ],
)
def test_a_wrong_daemon_env_is_refused_naming_the_entry(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        daemon_env(text)
