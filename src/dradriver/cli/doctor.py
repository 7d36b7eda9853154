"""``dradriver doctor``: a node preflight to run before and after installing the driver (or as the DaemonSet's
init step). Every check is read-only and ends OK, WARN, FAIL (with its fix) or SKIP; the exit status is 0 only
when nothing fails.

What it checks, in order: NVML (from where it loads), the driver and CUDA versions, libcuda and each class of
driver library (where, and whether through the linker cache or a search), binaries, firmware, device nodes and
MIG capability nodes, the CDI hook, the CDI directory, the container runtime's CDI settings (containerd and
CRI-O config files), the kubelet's plugin directories, the API server's version and DRA API (with
``--kubeconfig``, or in a pod with its service account) with the DRA feature gates it reports, persistence mode
and, on NVSwitch systems, the fabric manager.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cli.driver_root import add_driver_root_options, nvml_library_for, plugin_dir_of
from dradriver.cli.options import add_env_option, add_gpu_options, add_output_option
from dradriver.errors import DradriverError
from dradriver.gpu.backend import open_gpu_backend
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import Inventory, discover
from dradriver.nvidia_install.cdi_hook import HOOK_NAME
from dradriver.nvidia_install.driver_root import (
    CDI_HOOK,
    FOUND_IN_CONF,
    KNOWN_ROOTS,
    DriverFilesMissing,
    DriverRoot,
    DriverRootError,
    discover_driver_root,
    find_library,
    likely_driver_roots,
)
from dradriver.nvidia_install.root_paths import regular_file
from dradriver.plugin.cluster.resource_versions import VERSIONS
from dradriver.plugin.kubeletplugin.plugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
EXIT_FAILED = 1
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
# The oldest Kubernetes minor the driver publishes to (resource.k8s.io/v1beta1; v1, DRA GA, from 1.34).
MIN_MINOR = 32
ROOT_FIX = (
    "install the NVIDIA driver, or point --driver-root (host path; /run/nvidia/driver with the GPU Operator, "
    "/home/kubernetes/bin/nvidia on GKE) and --container-driver-root (its mount here) at its root"
)
#: Library classes, by file-name prefix, the way an admin thinks of them.
LIBRARY_CLASSES = (
    ("CUDA", ("libcuda.", "libnvidia-ptxjitcompiler.", "libnvidia-nvvm", "libcudadebugger.")),
    ("NVML", ("libnvidia-ml.",)),
    ("video", ("libnvcuvid.", "libnvidia-encode.", "libvdpau_nvidia.", "libnvidia-opticalflow.")),
    ("graphics", ("libGLX_nvidia.", "libEGL_nvidia.", "libGLESv", "libnvidia-glcore.", "libnvidia-eglcore.")),
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


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
        print(json.dumps({"ok": not _failed(checks), "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render_table(checks))
    return EXIT_FAILED if _failed(checks) else 0


def _failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def render_table(checks: list[Check]) -> str:
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


def run_checks(args: argparse.Namespace) -> Iterator[Check]:
    """Every check, in order; a check that cannot run says why instead."""
    gpulib, inventory, nvml_check = _open_nvml(args)
    yield nvml_check
    try:
        if inventory is None:
            yield _libcuda_without_nvml(args)
        else:
            yield Check(
                "driver version",
                OK,
                f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, "
                f"{len(inventory.gpus)} GPU(s), {len(inventory.mig_devices)} MIG device(s)",
            )
            root, root_checks = _driver_root_checks(args, inventory.driver_version, simulated=args.gpu_backend == "sim")
            yield from root_checks
            yield from _device_node_checks(args, inventory)
            yield _persistence_check(root)
            yield _fabric_check(gpulib, inventory)
        yield _hook_check(args)
        yield _writable_dir("CDI directory", Path(args.cdi_dir), "--cdi-dir", "the runtime reads specs there")
        yield from _runtime_checks(args)
        yield _writable_dir(
            "kubelet registry", Path(args.registry_dir), "--registry-dir", "the kubelet finds plugins there"
        )
        yield _writable_dir(
            "kubelet plugins", plugin_dir_of(args).parent, "--plugin-dir", "the plugin's sockets and state go there"
        )
        yield from _api_checks(args)
    finally:
        if gpulib is not None:
            gpulib.close()


def _open_nvml(args: argparse.Namespace) -> tuple[GpuLib | None, Inventory | None, Check]:
    library = nvml_library_for(args)
    try:
        gpulib, simulated = open_gpu_backend(
            args.gpu_backend,
            sim_profile=args.sim_profile,
            sim_state=Path(args.sim_state) if args.sim_state else None,
            nvml_library=library,
        )
    except DradriverError as err:
        return None, None, Check("NVML", FAIL, str(err), ROOT_FIX)
    where = (
        f"simulated node {args.sim_profile}"
        if simulated is not None
        else f"loaded from {library}"
        if library
        else "loaded by soname through this process's loader (not found in the driver root)"
    )
    try:
        inventory = discover(gpulib)
    except DradriverError as err:
        gpulib.close()
        return None, None, Check("NVML", FAIL, f"{where}; discovery failed: {err}", "see the NVML error above")
    return gpulib, inventory, Check("NVML", OK if simulated is not None or library else WARN, where)


def _driver_root_checks(
    args: argparse.Namespace, version: str, *, simulated: bool
) -> tuple[DriverRoot | None, list[Check]]:
    host = PurePosixPath(args.driver_root or "/")
    container = Path(args.container_driver_root or str(host))
    if simulated and not args.driver_root:
        return None, [Check("driver root", SKIP, "simulated node without --driver-root: run writes a stub root")]
    try:
        root = discover_driver_root(host_root=host, container_root=container, version=version, cdi_hook=None)
    except DriverRootError as err:
        elsewhere = likely_driver_roots(container, host, version) if container.is_dir() else []
        fix = (
            f"the driver's files are under {' and '.join(elsewhere)}: set --driver-root {elsewhere[0]}"
            if elsewhere
            else "install the driver's user-space libraries of this version and run ldconfig; or set --driver-root "
            "to the root that has them"
        )
        detail = (
            f"libcuda.so.{version} not found in driver root {host} (its linker cache, ld.so.conf and the usual "
            "library directories searched)"
            if isinstance(err, DriverFilesMissing) and container.is_dir()
            else str(err).split(";")[0]
        )
        return None, [Check("libcuda", FAIL, detail, fix)]
    checks = [_libcuda_check(root)]
    for name, prefixes in LIBRARY_CLASSES:
        files = [f for f in root.libraries if f.path.name.startswith(prefixes)]
        dirs = sorted({f"/{f.path.parent}" for f in files})
        if files:
            checks.append(Check(f"{name} libraries", OK, f"{len(files)} in {', '.join(dirs)}"))
        elif name == "NVML":
            checks.append(Check("NVML libraries", FAIL, "libnvidia-ml is missing", "reinstall the driver"))
        else:
            checks.append(Check(f"{name} libraries", OK, "none (not installed with this driver)"))
    smi = next((f for f in root.binaries if f.path.name == "nvidia-smi"), None)
    checks.append(
        Check("binaries", OK, ", ".join(f"/{f.path}" for f in root.binaries))
        if smi
        else Check("binaries", WARN, "nvidia-smi not found", "install the driver's utilities (nvidia-smi)")
    )
    checks.append(
        Check("GSP firmware", OK, f"{len(root.firmware)} file(s) in /{root.firmware[0].path.parent}")
        if root.firmware
        else Check("GSP firmware", WARN, f"no nvidia/{version}/gsp*.bin", "needed by GPUs that run GSP firmware")
    )
    return root, checks


def _libcuda_without_nvml(args: argparse.Namespace) -> Check:
    """Without NVML the version is unknown: still say whether the root has a libcuda, and where else one is."""
    host = PurePosixPath(args.driver_root or "/")
    container = Path(args.container_driver_root or str(host))
    found, how = find_library(container, "libcuda.so.1")
    if found is not None:
        return Check("libcuda", WARN, f"{host / found} (through {how}), but NVML did not load", "see NVML above")
    elsewhere = [
        str(host / relative)
        for relative in KNOWN_ROOTS
        if find_library(container / relative, "libcuda.so.1")[0] is not None
    ]
    fix = f"set --driver-root {elsewhere[0]}" if elsewhere else ROOT_FIX
    return Check("libcuda", FAIL, f"libcuda.so.1 not found in driver root {host} (searched {how})", fix)


def _libcuda_check(root: DriverRoot) -> Check:
    where = f"{root.host_root / root.libcuda.path} (through {root.libcuda.found_by})"
    if root.libcuda.found_by == FOUND_IN_CONF:
        return Check("libcuda", WARN, where, "run ldconfig on the host: its linker cache does not list libcuda")
    return Check("libcuda", OK, where)


def _device_node_checks(args: argparse.Namespace, inventory: Inventory) -> Iterator[Check]:
    if args.gpu_backend == "sim":
        yield Check("device nodes", SKIP, "simulated node: specs bind /dev/null")
        return
    dev = Path(args.dev_dir)
    needed = ["nvidiactl", *(f"nvidia{gpu.info.minor}" for gpu in inventory.gpus)]
    missing = [name for name in needed if not (dev / name).exists()]
    if missing:
        yield Check(
            "device nodes",
            FAIL,
            f"missing {', '.join('/dev/' + m for m in missing)}",
            "load the nvidia kernel module and create the nodes (nvidia-modprobe, or nvidia-smi once as root)",
        )
    else:
        uvm = (dev / "nvidia-uvm").exists()
        yield Check(
            "device nodes",
            OK if uvm else WARN,
            f"{len(needed)} present" + ("" if uvm else "; /dev/nvidia-uvm missing"),
            "" if uvm else "load nvidia-uvm (nvidia-modprobe -u -c=0): CUDA needs it",
        )
    if any(gpu.info.mig_capable for gpu in inventory.gpus):
        caps = Path("/proc/driver/nvidia/capabilities")
        yield (
            Check("MIG capabilities", OK, f"{caps} readable; specs create /dev/nvidia-caps nodes")
            if caps.is_dir()
            else Check("MIG capabilities", FAIL, f"{caps} missing", "mount the host's /proc (MIG devices need it)")
        )


def _persistence_check(root: DriverRoot | None) -> Check:
    if root is None:
        return Check("persistence mode", SKIP, "no driver root")
    if any(f.path.parts[-2:] == ("nvidia-persistenced", "socket") for f in root.sockets):
        return Check("persistence mode", OK, "nvidia-persistenced is running")
    return Check(
        "persistence mode",
        WARN,
        "nvidia-persistenced is not running",
        "enable nvidia-persistenced: without it every container start initialises the GPU again",
    )


def _fabric_check(gpulib: GpuLib | None, inventory: Inventory) -> Check:
    if gpulib is None or not inventory.gpus:
        return Check("fabric manager", SKIP, "no GPUs")
    registered = []
    for gpu in inventory.gpus:
        try:
            registered.append(gpulib.probe(gpu.uuid).fabric_registered)
        except DradriverError:
            continue
    if all(state is None for state in registered):
        return Check("fabric manager", OK, "no NVSwitch fabric")
    if all(registered):
        return Check("fabric manager", OK, "every GPU registered with the NVLink fabric")
    return Check(
        "fabric manager",
        FAIL,
        f"{registered.count(False)} GPU(s) not registered with the NVLink fabric",
        "start nvidia-fabricmanager (the same version as the driver): NVSwitch systems need it for CUDA",
    )


def _hook_check(args: argparse.Namespace) -> Check:
    if args.nvidia_cdi_hook_path == "none":
        return Check("CDI hook", WARN, "hooks turned off", "specs still work; drop --nvidia-cdi-hook-path none")
    if args.nvidia_cdi_hook_path:
        return Check("CDI hook", OK, f"{args.nvidia_cdi_hook_path} (as given)")
    source = args.cdi_hook_source or shutil.which(HOOK_NAME) or ""
    if source and source != "none":
        # What run needs of it: a file to copy (the copy is made executable).
        if not Path(source).is_file():
            return Check(
                "CDI hook",
                FAIL,
                f"--cdi-hook-source {source} is not a file",
                "give the image's nvidia-cdi-hook, or none to ship no hook",
            )
        return Check("CDI hook", OK, f"{source}, copied to {plugin_dir_of(args) / HOOK_NAME} at start")
    container = Path(args.container_driver_root or args.driver_root or "/")
    in_root = regular_file(container, PurePosixPath(CDI_HOOK))
    if in_root is not None:
        return Check("CDI hook", OK, f"{PurePosixPath(args.driver_root or '/') / in_root} (in the driver root)")
    return Check(
        "CDI hook",
        WARN,
        "no nvidia-cdi-hook: specs without hooks",
        "ship the image's hook (--cdi-hook-source) so images' linker caches list the driver's libraries",
    )


def _writable_dir(name: str, path: Path, flag: str, why: str) -> Check:
    if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
        return Check(name, OK, f"{path} writable")
    state = "not writable" if path.is_dir() else "missing"
    return Check(name, FAIL, f"{path} {state}", f"create {path} or mount the host's ({flag}): {why}")


def _runtime_checks(args: argparse.Namespace) -> Iterator[Check]:
    found = False
    containerd = _read_toml(Path(args.containerd_config))
    if containerd is not None:
        found = True
        yield _containerd_check(args, containerd)
    crio_files = [Path(args.crio_config), *sorted(Path(f"{args.crio_config}.d").glob("*.conf"))]
    crio = [doc for doc in map(_read_toml, crio_files) if doc is not None]
    if crio:
        found = True
        dirs: list[str] | None = None
        for doc in crio:
            dirs = _find_key(doc, "cdi_spec_dirs") or dirs
        yield _spec_dirs_check("CRI-O CDI", args.cdi_dir, dirs, "CRI-O enables CDI by default")
    if not found:
        yield Check(
            "container runtime CDI",
            WARN,
            f"neither {args.containerd_config} nor {args.crio_config} found",
            "check the runtime by hand: containerd 2.x and CRI-O enable CDI by default, containerd 1.7 needs "
            "enable_cdi = true",
        )


def _containerd_check(args: argparse.Namespace, config: dict[str, Any]) -> Check:
    version = config.get("version", 1)
    enabled = _find_key(config, "enable_cdi")
    # containerd 2.x (config version 3) turned CDI on by default; 1.7 (version 2) has it off.
    on = enabled if isinstance(enabled, bool) else version >= 3
    if not on:
        return Check(
            "containerd CDI",
            FAIL,
            f"CDI off in {args.containerd_config} (config version {version})",
            'set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"] and restart containerd',
        )
    return _spec_dirs_check("containerd CDI", args.cdi_dir, _find_key(config, "cdi_spec_dirs"), "CDI on")


def _spec_dirs_check(name: str, cdi_dir: str, dirs: Any, on: str) -> Check:
    effective = dirs if isinstance(dirs, list) else ["/etc/cdi", "/var/run/cdi"]
    normal = {os.path.normpath(str(d)).replace("/var/run/", "/run/") for d in effective}
    if os.path.normpath(cdi_dir).replace("/var/run/", "/run/") in normal:
        return Check(name, OK, f"{on}; spec dirs {', '.join(map(str, effective))}")
    return Check(
        name,
        FAIL,
        f"{on}, but {cdi_dir} is not among its spec dirs ({', '.join(map(str, effective))})",
        f"add {cdi_dir} to cdi_spec_dirs, or set --cdi-dir to one of them",
    )


def _read_toml(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as stream:
            return tomllib.load(stream)
    except (OSError, tomllib.TOMLDecodeError):
        return None


def _find_key(doc: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in a TOML document (its table differs between runtime versions)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for value in doc.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    return None


def _api_checks(args: argparse.Namespace) -> Iterator[Check]:
    if not args.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        # In a pod (`kubectl exec … -- dradriver doctor`) the service account is used, as `run` uses it.
        yield Check("API server", SKIP, "pass --kubeconfig to check the API server's version and DRA API")
        return
    from dradriver.plugin.cluster.kube import load_transport

    try:
        transport = load_transport(args.kubeconfig)
    except DradriverError as err:
        yield Check("API server", FAIL, str(err), "fix --kubeconfig (in a pod: its service account)")
        return

    def get(path: str) -> bytes:
        response = transport.request("GET", path, timeout=(5.0, 10.0))
        data = response.read()
        if not 200 <= response.status <= 299:
            raise RuntimeError(f"GET {path}: HTTP {response.status}: {data[:200].decode(errors='replace')}")
        return data

    try:
        yield from _api_version_checks(lambda: json.loads(get("/version")), lambda: json.loads(get("/apis")))
        # The `kubernetes_feature_enabled` series of /metrics name every feature gate.
        yield _feature_gate_check(lambda: get("/metrics").decode(), args.mig_mode)
    finally:
        transport.close()


def feature_gates(metrics: str) -> dict[str, bool]:
    """Feature gate -> enabled, from Prometheus text lines like
    ``kubernetes_feature_enabled{name="DRADeviceTaints",stage="BETA"} 1``."""
    gates: dict[str, bool] = {}
    for line in metrics.splitlines():
        if not line.startswith("kubernetes_feature_enabled{"):
            continue
        labels, _, value = line.rpartition("} ")
        name = next(
            (v for k, _, v in (p.partition("=") for p in labels.split("{", 1)[1].split(",")) if k == "name"), ""
        )
        if name:
            gates[name.strip('"')] = value.strip() in ("1", "1.0")
    return gates


#: The API server's DRA feature gates our driver uses, and what it does while one is off.
DRA_GATES = {
    "DRAPartitionableDevices": "no dynamic MIG (--mig-mode dynamic publishes MIG partitions on shared counters)",
    "DRAConsumableCapacity": "no consumable shares (--gpu-sharing consumable, --consumable-shares)",
    "DRADeviceTaints": "unhealthy devices are withdrawn from the slices instead of tainted",
    "DRAExtendedResource": "no `nvidia.com/gpu: N` pods through the DeviceClasses' extendedResourceName",
    "DRAResourceClaimDeviceStatus": "claims' status.devices are dropped",
    "DRAPrioritizedList": "no firstAvailable requests",
    "DRAAdminAccess": "no adminAccess requests (monitoring)",
}


def _feature_gate_check(read_metrics: Callable[[], str], mig_mode: str) -> Check:
    name = "DRA features"
    try:
        gates = feature_gates(read_metrics())
    except Exception as err:  # 403 for a service account without /metrics, or no answer: the check cannot run
        return Check(
            name,
            SKIP,
            f"cannot read the API server's /metrics ({str(err).splitlines()[0][:120]})",
            "run doctor with a kubeconfig allowed `get` on the non-resource URL /metrics to see its feature gates",
        )
    known = {gate: gates[gate] for gate in DRA_GATES if gate in gates}
    if not known:
        return Check(name, SKIP, "the API server's /metrics names no DRA feature gate")
    off = [gate for gate, enabled in known.items() if not enabled]
    detail = f"on: {', '.join(g for g, e in known.items() if e) or 'none'}"
    if not off:
        return Check(name, OK, detail)
    detail += "; off: " + "; ".join(f"{gate} ({DRA_GATES[gate]})" for gate in off)
    needed = "DRAPartitionableDevices" in off and mig_mode == "dynamic"
    return Check(
        name,
        FAIL if needed else WARN,
        detail,
        "turn DRAPartitionableDevices on (API server and scheduler) or run --mig-mode static"
        if needed
        else "turn the gates on in the API server and scheduler (--feature-gates) where you need what they do",
    )


def _api_version_checks(get_version: Callable[[], Any], get_groups: Callable[[], Any]) -> Iterator[Check]:
    """The server's version (``GET /version``) and the resource.k8s.io versions it serves (``GET /apis``), both
    as the JSON the server sends."""
    try:
        version, groups = get_version(), get_groups().get("groups") or []
        minor = int("".join(ch for ch in str(version.get("minor", "")) if ch.isdigit()) or 0)
        git_version = str(version.get("gitVersion", "?"))
    except Exception as err:  # no answer, an error status or no JSON: all mean the check cannot be made
        yield Check("API server", FAIL, f"unreachable: {err}", "check --kubeconfig and the network")
        return
    yield (
        Check("API server", OK, f"Kubernetes {git_version}")
        if minor >= MIN_MINOR
        else Check("API server", FAIL, f"Kubernetes {git_version}", f"upgrade to 1.{MIN_MINOR} or newer")
    )
    resource = next((g for g in groups if g.get("name") == "resource.k8s.io"), None)
    served = [str(v.get("version")) for v in resource.get("versions") or []] if resource else []
    spoken = next((v for v in VERSIONS if v in served), None)
    if spoken == "v1":
        yield Check("DRA API", OK, f"resource.k8s.io {', '.join(served)}")
    elif spoken is not None:
        yield Check(
            "DRA API",
            OK,
            f"resource.k8s.io {', '.join(served)}: the driver speaks {spoken} (Kubernetes 1.32/1.33: no dynamic MIG "
            "on 1.32, no consumable shares before 1.34; docs/publishing.md)",
        )
    else:
        yield Check(
            "DRA API",
            FAIL,
            f"resource.k8s.io not served in v1, v1beta2 or v1beta1 ({', '.join(served) or 'no versions'})",
            "enable DRA: Kubernetes 1.34+ serves it; on 1.32/1.33 turn on the DynamicResourceAllocation feature gate "
            "and --runtime-config=resource.k8s.io/v1beta1=true (1.33: also resource.k8s.io/v1beta2=true)",
        )
