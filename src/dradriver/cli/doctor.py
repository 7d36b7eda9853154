"""``dradriver doctor``: a node preflight to run before and after installing the driver (or as the DaemonSet's
init step). Every check is read-only and ends OK, WARN, FAIL (with its fix) or SKIP; the exit status is 0 only
when nothing fails.

What it checks, in order: NVML (from where it loads), the driver and CUDA versions, libcuda and each class of
driver library (where, and whether through the linker cache or a search), binaries, firmware, device nodes and
MIG capability nodes, the CDI hook, the CDI directory, the container runtime's CDI settings (containerd and
CRI-O config files), the kubelet's plugin directories, the API server's version and DRA API (with
``--kubeconfig``, or in a pod with its service account) with the DRA feature gates it reports, persistence mode
and, on NVSwitch systems, the fabric manager.

The checks are :mod:`dradriver.driver.checks`'; this command builds their settings from its flags, runs them in
that order and renders the results (a table or JSON).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cli.driver_root import add_driver_root_options, nvml_library_for, plugin_dir_of
from dradriver.cli.options import add_env_option, add_gpu_options, add_output_option
from dradriver.driver.checks.cluster import api_server_checks
from dradriver.driver.checks.driver_files import hook_check
from dradriver.driver.checks.host import gpu_checks, writable_dir
from dradriver.driver.checks.result import FAIL, WARN, CheckResult, any_failed
from dradriver.driver.checks.runtime import CONTAINERD_CONFIG, CRIO_CONFIG, runtime_cdi_checks
from dradriver.driver.checks.settings import ClusterSettings, HostSettings, RuntimeSettings
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR

EXIT_FAILED = 1


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Check this node for the driver: NVML, the driver's files, device nodes, the CDI hook and directory, the "
        "container runtime's CDI setting, the kubelet's directories and (with --kubeconfig, or in a pod with its "
        "service account) the API server. "
        "Exit status 0 only when no check fails."
    )
    add_gpu_options(parser)
    add_driver_root_options(parser)
    add_env_option(
        parser, "--driver-name", env="DRADRIVER_DRIVER_NAME", default=DEFAULT_DRIVER_NAME, help="driver name"
    )
    add_env_option(parser, "--cdi-dir", env="DRADRIVER_CDI_DIR", default="/var/run/cdi", help="CDI spec directory")
    add_env_option(
        parser,
        "--plugin-dir",
        env="DRADRIVER_PLUGIN_DIR",
        help=f"plugin directory (default: {DEFAULT_PLUGINS_DIR}/<driver-name>)",
    )
    add_env_option(
        parser,
        "--registry-dir",
        env="DRADRIVER_REGISTRY_DIR",
        default=str(DEFAULT_REGISTRY_DIR),
        help="kubelet plugin registration directory",
    )
    add_env_option(
        parser,
        "--kubeconfig",
        env="DRADRIVER_KUBECONFIG",
        help="check the API server too (version, DRA API); in a pod its service account is used without it",
    )
    add_env_option(
        parser,
        "--containerd-config",
        env="DRADRIVER_CONTAINERD_CONFIG",
        default=CONTAINERD_CONFIG,
        help="containerd's config file",
    )
    add_env_option(
        parser, "--crio-config", env="DRADRIVER_CRIO_CONFIG", default=CRIO_CONFIG, help="CRI-O's config file"
    )
    add_env_option(
        parser,
        "--dev-dir",
        env="DRADRIVER_DEV_DIR",
        default="/dev",
        help="where the host's device nodes are seen",
    )
    add_output_option(parser, ("table", "json"), "table")
    parser.set_defaults(handler=doctor)


def doctor(args: argparse.Namespace) -> int:
    checks = list(run_checks(args))
    if args.output == "json":
        print(json.dumps({"ok": not any_failed(checks), "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render_table(checks))
    return EXIT_FAILED if any_failed(checks) else 0


def render_table(checks: list[CheckResult]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  STATUS  DETAIL"]
    for check in checks:
        lines.append(f"{check.name.ljust(width)}  {check.status.ljust(6)}  {check.detail}")
        if check.fix:
            lines.append(f"{''.ljust(width)}  {''.ljust(6)}  fix: {check.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    lines.append(f"\n{failed} failed, {warned} warnings, {len(checks)} checks")
    return "\n".join(lines)


def run_checks(args: argparse.Namespace) -> Iterator[CheckResult]:
    """Every check (dradriver.driver.checks), in order; a check that cannot run says why instead."""
    host = host_settings(args)
    yield from gpu_checks(host)
    yield hook_check(host)
    yield writable_dir("CDI directory", Path(args.cdi_dir), "--cdi-dir", "the runtime reads specs there")
    yield from runtime_cdi_checks(
        RuntimeSettings(containerd_config=args.containerd_config, crio_config=args.crio_config, cdi_dir=args.cdi_dir)
    )
    yield writable_dir("kubelet registry", Path(args.registry_dir), "--registry-dir", "the kubelet finds plugins there")
    yield writable_dir(
        "kubelet plugins", host.plugin_dir.parent, "--plugin-dir", "the plugin's sockets and state go there"
    )
    # In a pod (`kubectl exec … -- dradriver doctor`) the service account is used, as `run` uses it.
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    yield from api_server_checks(ClusterSettings(kubeconfig=args.kubeconfig, in_pod=in_pod, mig_mode=args.mig_mode))


def host_settings(args: argparse.Namespace) -> HostSettings:
    """What the host checks read, from doctor's flags (those ``run`` shares)."""
    return HostSettings(
        gpu_backend=args.gpu_backend,
        sim_profile=args.sim_profile,
        sim_state=Path(args.sim_state) if args.sim_state else None,
        nvml_library=nvml_library_for(args),
        driver_root=args.driver_root,
        container_driver_root=args.container_driver_root or "",
        dev_dir=Path(args.dev_dir),
        plugin_dir=plugin_dir_of(args),
        nvidia_cdi_hook_path=args.nvidia_cdi_hook_path,
        cdi_hook_source=args.cdi_hook_source,
    )
