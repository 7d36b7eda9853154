"""``dradriver doctor``: a node preflight to run before and after installing the driver (or as the DaemonSet's
init step). Every check is read-only and ends OK, WARN, FAIL (with its fix) or SKIP; the exit status is 0 only
when nothing fails.

What it checks, in order: NVML (from where it loads), the driver and CUDA versions, libcuda and each class of
driver library (where, and whether through the linker cache or a search), binaries, firmware, device nodes and
MIG capability nodes, the CDI hook, the CDI directory, the container runtime's CDI settings (containerd and
CRI-O config files), the kubelet's plugin directories, the API server's version and DRA API (through the
kubeconfig every command finds: ``--kubeconfig``, ``$KUBECONFIG``, in a pod its service account,
``~/.kube/config``) with the DRA feature gates it reports, persistence mode and, on NVSwitch systems, the fabric
manager; last, NVIDIA's device plugin on the node (its kubelet socket, and with ``--node-name`` the Node's
``nvidia.com/`` resources), which must not hand out the GPUs the driver publishes.

The checks are :mod:`dradriver.driver.checks`'; this command builds their settings from its flags, runs them in
that order and renders the results (a table or JSON).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from dradriver.cli.flags import device_plugin, driver_root, gpus, kube_client
from dradriver.cli.flags.device_plugin import DevicePluginOptions
from dradriver.cli.flags.driver_root import DriverRootOptions
from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.gpus import GpuOptions
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.flags.node_dirs import CDI_DIR, PLUGIN_DIR, REGISTRY_DIR, plugin_dir_of
from dradriver.cli.flags.output import add_output_option
from dradriver.cli.flags.publishing import DRIVER_NAME
from dradriver.driver.checks.cluster import api_server_checks
from dradriver.driver.checks.device_plugin import device_plugin_row
from dradriver.driver.checks.driver_files import hook_check
from dradriver.driver.checks.host import gpu_checks, writable_dir
from dradriver.driver.checks.result import FAIL, WARN, CheckResult, any_failed
from dradriver.driver.checks.runtime import CONTAINERD_CONFIG, CRIO_CONFIG, runtime_cdi_checks
from dradriver.driver.checks.settings import ClusterSettings, HostSettings, RuntimeSettings
from dradriver.errors import ConfigError
from dradriver.plugin.cluster.kubeconfig import FLAG
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR

EXIT_FAILED = 1


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line): the flags it shares
    with ``run`` from their groups (``cli/flags/``), worded for what doctor checks, and its own."""
    parser.description = (
        "Check this node for the driver: NVML, the driver's files, device nodes, the CDI hook and directory, the "
        "container runtime's CDI setting, the kubelet's directories, (with a kubeconfig, or in a pod with its "
        "service account) the API server, and NVIDIA's device plugin on the node. "
        "Exit status 0 only when no check fails."
    )
    gpus.add_flags(parser)
    driver_root.add_flags(parser)
    DRIVER_NAME.add(parser, help="driver name")
    CDI_DIR.add(parser, help="CDI spec directory")
    PLUGIN_DIR.add(parser, help=f"plugin directory (default: {DEFAULT_PLUGINS_DIR}/<driver-name>)")
    REGISTRY_DIR.add(parser)
    device_plugin.add_flags(parser, coexistence=False)
    NODE_NAME.add(
        parser, help="this node's name: the device plugin check reads its Node's nvidia.com/gpu* and mig-* resources"
    )
    kube_client.add_flags(
        parser,
        kubeconfig_help="check the API server too (version, DRA API) through this kubeconfig file",
        rate_limits=False,
    )
    _add_host_flags(parser)
    add_output_option(parser, ("table", "json"), "table")
    parser.set_defaults(handler=doctor)


def _add_host_flags(parser: argparse.ArgumentParser) -> None:
    """Doctor's own: where the container runtimes' config files and the host's device nodes are."""
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


def doctor(args: argparse.Namespace) -> int:
    # A kubeconfig given (--kubeconfig, $KUBECONFIG) that cannot be used is an input error (exit 2, one line), as
    # for every command; one the rule found by itself is the API server's FAIL row (cluster_settings).
    cluster = cluster_settings(args)
    checks = list(run_checks(args, cluster))
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


def run_checks(args: argparse.Namespace, cluster: ClusterSettings | CheckResult) -> Iterator[CheckResult]:
    """Every check (dradriver.driver.checks), in order; a check that cannot run says why instead (``cluster``: how
    to reach the API server, or the row saying why it cannot be)."""
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
    if isinstance(cluster, CheckResult):
        yield cluster
    else:
        yield from api_server_checks(cluster)
    # NVIDIA's device plugin beside the driver would hand out the same GPUs.
    plugin = DevicePluginOptions.from_args(args).settings(NODE_NAME.value(args) or "")
    yield device_plugin_row(plugin, None if isinstance(cluster, CheckResult) else cluster)


def cluster_settings(args: argparse.Namespace) -> ClusterSettings | CheckResult:
    """How the API server checks reach it, by the rule every command follows (``--kubeconfig``, ``$KUBECONFIG``,
    in a pod the service account, ``~/.kube/config``), loaded now; no endpoint when none is there (the checks are
    skipped). A kubeconfig given by flag or variable that cannot be used is refused (a ConfigError) before any
    check runs; a configuration the rule found by itself (the pod's service account, ``~/.kube/config``) that cannot
    be loaded is the API server's FAIL row, with its fix, and every node check still runs."""
    kube = KubeClientOptions.from_args(args)
    source, mig_mode = kube.source, GpuOptions.from_args(args).mig_mode.value
    if source is None:
        return ClusterSettings(endpoint=None, mig_mode=mig_mode)
    try:
        endpoint = kube.endpoint
    except ConfigError as err:
        if source.origin in (FLAG, "$KUBECONFIG"):
            raise
        # The loader's messages end with their fix after the last "; ".
        problem, _, fix = str(err).rpartition("; ")
        return CheckResult("API server", FAIL, problem, fix) if problem else CheckResult("API server", FAIL, fix)
    return ClusterSettings(endpoint=endpoint, source=str(source), mig_mode=mig_mode)


def host_settings(args: argparse.Namespace) -> HostSettings:
    """What the host checks read, from doctor's flags (those ``run`` shares, read by their groups)."""
    gpu = GpuOptions.from_args(args)
    root = DriverRootOptions.from_args(args)
    return HostSettings(
        gpu_backend=gpu.backend,
        sim_profile=gpu.sim_profile,
        sim_state=gpu.sim_state,
        nvml_library=root.nvml_library(gpu.backend),
        driver_root=root.driver_root,
        container_driver_root=root.container_driver_root or "",
        dev_dir=Path(args.dev_dir),
        plugin_dir=plugin_dir_of(args),
        nvidia_cdi_hook_path=root.nvidia_cdi_hook_path,
        cdi_hook_source=root.cdi_hook_source,
    )
