"""The container runtime's CDI setting, read from its config files: containerd's (CDI on, by default from config
version 3) and CRI-O's (with its drop-in directory), each with the spec directories it reads."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dradriver.driver.checks.result import FAIL, OK, WARN, CheckResult
from dradriver.driver.checks.settings import RuntimeSettings

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
#: Where both runtimes look for CDI specs unless ``cdi_spec_dirs`` says otherwise.
DEFAULT_SPEC_DIRS = ["/etc/cdi", "/var/run/cdi"]


def runtime_cdi_checks(settings: RuntimeSettings) -> Iterator[CheckResult]:
    """A check for each runtime whose config file exists (containerd, then CRI-O); a WARN where neither does."""
    found = False
    containerd = read_toml(Path(settings.containerd_config))
    if containerd is not None:
        found = True
        yield containerd_check(settings, containerd)
    crio_files = [Path(settings.crio_config), *sorted(Path(f"{settings.crio_config}.d").glob("*.conf"))]
    crio = [doc for doc in map(read_toml, crio_files) if doc is not None]
    if crio:
        found = True
        yield crio_check(settings, crio)
    if not found:
        yield CheckResult(
            "container runtime CDI",
            WARN,
            f"neither {settings.containerd_config} nor {settings.crio_config} found",
            "check the runtime by hand: containerd 2.x and CRI-O enable CDI by default, containerd 1.7 needs "
            "enable_cdi = true",
        )


def containerd_check(settings: RuntimeSettings, config: dict[str, Any]) -> CheckResult:
    """containerd's parsed ``config``: CDI on, and our CDI directory among its spec directories."""
    version = config.get("version", 1)
    enabled = find_key(config, "enable_cdi")
    # containerd 2.x (config version 3) turned CDI on by default; 1.7 (version 2) has it off.
    on = enabled if isinstance(enabled, bool) else version >= 3
    if not on:
        return CheckResult(
            "containerd CDI",
            FAIL,
            f"CDI off in {settings.containerd_config} (config version {version})",
            'set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] and restart containerd',
        )
    return spec_dirs_check("containerd CDI", settings.cdi_dir, find_key(config, "cdi_spec_dirs"), "CDI on")


def crio_check(settings: RuntimeSettings, documents: list[dict[str, Any]]) -> CheckResult:
    """CRI-O's parsed config files, in the order it reads them (a later ``cdi_spec_dirs`` wins)."""
    dirs: list[str] | None = None
    for doc in documents:
        dirs = find_key(doc, "cdi_spec_dirs") or dirs
    return spec_dirs_check("CRI-O CDI", settings.cdi_dir, dirs, "CRI-O enables CDI by default")


def spec_dirs_check(name: str, cdi_dir: str, dirs: Any, on: str) -> CheckResult:
    """Whether ``cdi_dir`` is among ``dirs`` (a runtime's ``cdi_spec_dirs``; its defaults where not a list),
    /var/run and /run taken as one."""
    effective = dirs if isinstance(dirs, list) else DEFAULT_SPEC_DIRS
    normal = {os.path.normpath(str(d)).replace("/var/run/", "/run/") for d in effective}
    if os.path.normpath(cdi_dir).replace("/var/run/", "/run/") in normal:
        return CheckResult(name, OK, f"{on}; spec dirs {', '.join(map(str, effective))}")
    return CheckResult(
        name,
        FAIL,
        f"{on}, but {cdi_dir} is not among its spec dirs ({', '.join(map(str, effective))})",
        f"add {cdi_dir} to cdi_spec_dirs, or set --cdi-dir to one of them",
    )


def read_toml(path: Path) -> dict[str, Any] | None:
    """The TOML document at ``path``; None where it is missing, unreadable or not TOML."""
    try:
        with path.open("rb") as stream:
            return tomllib.load(stream)
    except (OSError, tomllib.TOMLDecodeError):
        return None


def find_key(doc: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in a TOML document (its table differs between runtime versions)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for value in doc.values():
            found = find_key(value, key)
            if found is not None:
                return found
    return None
