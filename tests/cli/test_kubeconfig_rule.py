"""One kubeconfig rule for every command that talks to a cluster (run, doctor, explain --pod, cd-controller):
--kubeconfig, else $KUBECONFIG, else in a pod its service account, else ~/.kube/config; an unusable kubeconfig is
one line naming it, what is wrong and the fix, exit 2, before the command starts anything (doctor: one given by
flag or variable; one the rule found by itself is its API server check's FAIL row, so the node's checks still run)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import FakeApiServer
from support.written_paths import recorded_writes

from dradriver.cli.main import main

COMMANDS = {
    "run": ["run", "--node-name", "n", "--gpu-backend", "sim", "--metrics-address", ""],
    "doctor": ["doctor", "--gpu-backend", "sim"],
    "explain --pod": ["explain", "--pod", "default/trainer"],
    "cd-controller": ["cd-controller", "--metrics-address", ""],
}


def kubeconfig(path: Path, server: str = "https://127.0.0.1:1", *, context: str = "c") -> Path:
    """A kubeconfig whose current-context (``context``) points at ``server``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path.write_text(json.dumps(config))
    return path


def malformed(path: Path) -> Path:
    path.write_text("apiVersion: v1\nkind: Config\nclusters: [\n")
    return path


def empty(path: Path) -> Path:
    path.write_text("")
    return path


def binary(path: Path) -> Path:
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xba\xdc")
    return path


def directory(path: Path) -> Path:
    path.mkdir()
    return path


def missing_context(path: Path) -> Path:
    return kubeconfig(path, context="prod")


# Each broken kubeconfig, and what its one line says is wrong and what to do.
BROKEN = {
    "malformed": (malformed, "not valid YAML: line 4, column 1", "point --kubeconfig at a readable kubeconfig file"),
    "missing": (lambda path: path, "no such file", "point --kubeconfig at a readable kubeconfig file"),
    "a directory": (directory, "is a directory", "pass a file"),
    "empty": (empty, "expected one kubeconfig mapping (kind: Config), got an empty file", "point --kubeconfig"),
    "binary": (binary, "not UTF-8 text (byte 0x89 at offset 0)", "save it as UTF-8"),
    "missing context": (missing_context, "current-context 'prod' is not one of its contexts (contexts: c)",
                        "kubectl config use-context NAME"),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _nothing_found_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No kubeconfig of this machine's, and no pod: each test says which sources exist. Logging, which `run` and
    cd-controller point at this test's captured stderr, is put back afterwards."""
    for name in ("KUBECONFIG", "DRADRIVER_KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", BROKEN)
def test_an_unusable_kubeconfig_is_one_line_naming_it_and_the_fix_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, case: str
) -> None:
    make, problem, fix = BROKEN[case]
    path = make(tmp_path / "kubeconfig")
    code = main([*COMMANDS[command], "--kubeconfig", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    assert err.startswith(f"dradriver {command.split(maxsplit=1)[0]}: error: --kubeconfig {path}: {problem}"), err
    assert fix in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_kubeconfig_variable_is_named_as_the_source_of_a_broken_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    path = malformed(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert main(COMMANDS[command]) == 2
    err = capsys.readouterr().err
    assert f"error: $KUBECONFIG {path}: not valid YAML" in err
    assert err.rstrip().endswith("point KUBECONFIG at a readable kubeconfig file, or unset it"), err


@pytest.mark.parametrize("command", ["run", "explain --pod", "cd-controller"])
def test_without_any_client_configuration_the_commands_that_need_one_say_what_was_looked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main(COMMANDS[command]) == 2
    looked_for = "no --kubeconfig, no $KUBECONFIG, not in a pod (KUBERNETES_SERVICE_HOST unset)"
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"no Kubernetes client configuration: {looked_for} and no {tmp_path}/home/.kube/config; "
            "pass --kubeconfig FILE or set KUBECONFIG"
        )
    )


def _doctor_api_check(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, str]:
    main(["doctor", "--gpu-backend", "sim", "-o", "json", *flags])
    return next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "API server")


@pytest.fixture
def two_servers() -> Iterator[tuple[FakeApiServer, FakeApiServer]]:
    with FakeApiServer() as first, FakeApiServer() as second:
        yield first, second


def test_doctor_honours_kubeconfig_and_the_flag_comes_first(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    two_servers: tuple[FakeApiServer, FakeApiServer],
) -> None:
    by_variable, by_flag = two_servers
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "variable", by_variable.url)))
    check = _doctor_api_check(capsys)
    # (The stand-in serves /version, not /apis: the check fails past the connection, naming what it went through.)
    assert check["detail"].endswith(f"(through $KUBECONFIG {tmp_path / 'variable'})"), check
    assert [r.path for r in by_variable.requests][:1] == ["/version"] and not by_flag.requests
    seen = len(by_variable.requests)
    check = _doctor_api_check(capsys, "--kubeconfig", str(kubeconfig(tmp_path / "flag", by_flag.url)))
    assert f"through --kubeconfig {tmp_path / 'flag'}" in check["detail"], check
    assert by_flag.requests and len(by_variable.requests) == seen


def test_doctor_without_any_configuration_skips_the_api_server(capsys: pytest.CaptureFixture[str]) -> None:
    check = _doctor_api_check(capsys)
    assert check["status"] == "SKIP" and "pass --kubeconfig" in check["detail"]


@pytest.mark.parametrize("found", ["in a pod", "~/.kube/config"])
def test_doctor_runs_every_node_check_when_the_configuration_the_rule_found_cannot_be_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, found: str
) -> None:
    """Not given, so no input error: the node's checks matter most where the pod's service account (or the home
    kubeconfig) is broken; the API server is a FAIL row saying what is wrong and the fix."""
    assert main(["doctor", "--gpu-backend", "sim", "-o", "json"]) == 1  # the kubelet's directories are missing
    expected = [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]]
    if found == "in a pod":
        if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
            pytest.skip("this test runs in a pod with a service account")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
        problem = "cannot load the in-cluster configuration: the service account token "
        fix = "give the pod a service account with automountServiceAccountToken left on"
    else:
        (tmp_path / "home" / ".kube").mkdir(parents=True)
        problem = f"~/.kube/config {malformed(tmp_path / 'home' / '.kube' / 'config')}: not valid YAML"
        fix = "fix it, or pass --kubeconfig FILE"
    assert main(["doctor", "--gpu-backend", "sim", "-o", "json"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [c["name"] for c in checks] == expected
    api = next(c for c in checks if c["name"] == "API server")
    assert api["status"] == "FAIL" and api["detail"].startswith(problem) and api["fix"] == fix, api


@functools.cache
def _bind_hook() -> list[list[Any]]:
    """Recordings of every socket bound (Python's ``socket.bind`` audit event) while one is active."""
    recordings: list[list[Any]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.bind" and recordings:
            recordings[-1].append(args[1])

    sys.addaudithook(hook)
    return recordings


def _run_recorded(argv: list[str]) -> tuple[int, list[Path], list[Any]]:
    """``main(argv)``, with every path it wrote and every address it bound."""
    recordings = _bind_hook()
    recordings.append([])
    try:
        with recorded_writes() as written:
            code = main(argv)
    finally:
        bound = recordings.pop()
    return code, written, bound


def _run_argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        *("run", "--node-name", "n", "--gpu-backend", "sim", "--metrics-address", "127.0.0.1:0"),
        *("--plugin-dir", str(tmp_path / "plugin"), "--registry-dir", str(tmp_path / "registry")),
        *("--cdi-dir", str(tmp_path / "cdi"), "--sim-state", str(tmp_path / "sim.json")),
        *extra,
    ]


@pytest.mark.parametrize("case", BROKEN)
def test_run_with_an_unusable_kubeconfig_binds_no_port_discovers_no_gpu_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, problem, _fix = BROKEN[case]
    code, written, bound = _run_recorded(_run_argv(tmp_path, "--kubeconfig", str(make(tmp_path / "kubeconfig"))))
    err = capsys.readouterr().err
    assert code == 2 and problem in err, err
    assert (written, bound) == ([], [])
    assert "discovered" not in err


def test_run_refuses_a_flag_the_clusters_release_cannot_take_before_it_starts_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The release is read from the API server (no --kubernetes-version): 1.32 has no shared counters.
    with FakeApiServer() as old:
        old.version = {"major": "1", "minor": "32", "gitVersion": "v1.32.9", "platform": "linux/amd64"}
        config = kubeconfig(tmp_path / "kubeconfig", old.url)
        code, written, bound = _run_recorded(_run_argv(tmp_path, "--kubeconfig", str(config), "--mig-mode", "dynamic"))
    err = capsys.readouterr().err
    assert code == 2 and "--mig-mode dynamic needs shared counters in ResourceSlices" in err, err
    assert (written, bound) == ([], [])


def test_run_that_cannot_read_the_clusters_release_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig")  # nothing listens there
    code, written, bound = _run_recorded(_run_argv(tmp_path, "--kubeconfig", str(config)))
    err = capsys.readouterr().err
    assert code == 2 and "cannot read the API server's version" in err and "--kubernetes-version" in err, err
    assert (written, bound) == ([], [])


def test_run_refuses_an_unknown_simulated_profile_before_it_binds_a_port_or_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeApiServer() as api:
        config = kubeconfig(tmp_path / "kubeconfig", api.url)
        code, written, bound = _run_recorded(
            _run_argv(tmp_path, "--kubeconfig", str(config), "--sim-profile", "nosuch")
        )
    err = capsys.readouterr().err
    assert code == 2 and "unknown simulated node profile 'nosuch'" in err, err
    assert (written, bound) == ([], [])
    assert "serving metrics" not in err


def test_run_refuses_a_state_file_where_no_file_can_be_made_before_it_binds_a_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/proc takes no file, though root may write anywhere by its permissions: a file made there tells."""
    argv = _run_argv(tmp_path, "--kubernetes-version", "1.34")
    argv[argv.index("--sim-state") + 1] = "/proc/x"
    with FakeApiServer() as api:
        code, written, bound = _run_recorded([*argv, "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", api.url))])
    err = capsys.readouterr().err
    # As root: "cannot write the state file (No such file or directory)"; else the permissions already tell.
    assert code == 2 and err.startswith("dradriver run: error: --sim-state /proc/x") and err.count("\n") == 1, err
    assert bound == [] and not [path for path in written if path.exists()]


def test_cd_controller_with_an_unusable_kubeconfig_binds_no_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cd-controller", "--metrics-address", "127.0.0.1:0", "--kubeconfig", str(empty(tmp_path / "kubeconfig"))]
    code, written, bound = _run_recorded(argv)
    assert code == 2 and "got an empty file" in capsys.readouterr().err
    assert (written, bound) == ([], [])
