"""The container runtime's CDI setting read from containerd's and CRI-O's config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.driver.checks.runtime import runtime_cdi_checks, spec_dirs_check
from dradriver.driver.checks.settings import RuntimeSettings


def runtime(tmp_path: Path) -> RuntimeSettings:
    return RuntimeSettings(
        containerd_config=str(tmp_path / "containerd.toml"),
        crio_config=str(tmp_path / "crio.conf"),
        cdi_dir=str(tmp_path / "cdi"),
    )


@pytest.mark.parametrize(
    ("config", "status", "words"),
    [
        ('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\ncdi_spec_dirs = ["{cdi}"]\n', "OK", "CDI on"),
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n', "FAIL", "CDI off in"),
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = true\n', "FAIL", "is not among"),
    ],
    ids=["containerd-2-our-dir", "containerd-1.7-default-off", "containerd-1.7-default-dirs"],
)
def test_containerd_needs_cdi_on_and_our_spec_directory(tmp_path: Path, config: str, status: str, words: str) -> None:
    (tmp_path / "containerd.toml").write_text(config.format(cdi=tmp_path / "cdi"))
    [check] = runtime_cdi_checks(runtime(tmp_path))
    assert check.name == "containerd CDI" and check.status == status and words in check.detail


def test_a_crio_drop_in_overrides_the_spec_directories(tmp_path: Path) -> None:
    (tmp_path / "crio.conf").write_text('[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n')
    [before] = runtime_cdi_checks(runtime(tmp_path))
    assert before.name == "CRI-O CDI" and before.status == "FAIL"
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf.d/10-cdi.conf").write_text(f'[crio.runtime]\ncdi_spec_dirs = ["{tmp_path / "cdi"}"]\n')
    [after] = runtime_cdi_checks(runtime(tmp_path))
    assert after.status == "OK"


def test_without_a_runtime_config_it_warns_to_check_by_hand(tmp_path: Path) -> None:
    [check] = runtime_cdi_checks(runtime(tmp_path))
    assert check.name == "container runtime CDI" and check.status == "WARN" and "by hand" in check.fix


def test_var_run_and_run_are_the_same_spec_directory() -> None:
    assert spec_dirs_check("containerd CDI", "/run/cdi", None, "CDI on").status == "OK"
    assert spec_dirs_check("containerd CDI", "/var/run/cdi/", ["/run/cdi"], "CDI on").status == "OK"
