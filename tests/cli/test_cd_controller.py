"""``dradriver cd-controller``'s settings for the daemon pods it creates, and its flags checked before it starts."""

from __future__ import annotations

import logging

import pytest

from dradriver.cli.cd_controller import controller_settings, daemon_env
from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.main import build_parser, main
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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--interval", "0"], "argument --interval: '0': use a finite number of seconds above 0"),
        (["--lease-duration", "-1"], "argument --lease-duration: '-1': use a finite number of seconds above 0"),
        (["--max-nodes-per-imex-domain", "0"], "argument --max-nodes-per-imex-domain: '0': use a whole number"),
        (["--imex-mode", "hostmanaged"], "argument --imex-mode: invalid choice: 'hostmanaged'"),
        # Its own flags are checked before the kubeconfig is loaded (here there is none).
        (["--daemon-env", "A=1", "--kubeconfig", "/nonexistent/kubeconfig"], "--daemon-env is not JSON"),
    ],
)
def test_cd_controller_refuses_a_bad_setting_in_one_line_before_it_connects_or_listens(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        assert main(["cd-controller", "--metrics-address", "", *flags]) == 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_imex_mode_is_driver_managed_unless_host_managed_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def settings(*flags: str) -> bool:
        args = build_parser(["cd-controller"]).parse_args(["cd-controller", *flags])
        resolve_env_values(args)
        return controller_settings(args).host_managed

    assert settings() is False
    assert settings("--imex-mode", "hostManaged") is True
    # The chart's variable, as the node plugins read it.
    monkeypatch.setenv("DRADRIVER_IMEX_MODE", "hostManaged")
    assert settings() is True
    assert settings("--imex-mode", "driverManaged") is False
