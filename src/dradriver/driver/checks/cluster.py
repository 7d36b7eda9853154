"""The API server: its version, the resource.k8s.io versions it serves and the DRA feature gates it reports,
each check reading the server through an injected ``GET`` (:data:`ApiGet`), so any transport can serve it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dradriver.driver.checks.result import FAIL, OK, SKIP, WARN, CheckResult
from dradriver.driver.checks.settings import ClusterSettings
from dradriver.plugin.cluster.resource_versions import VERSIONS

if TYPE_CHECKING:
    from dradriver.plugin.cluster.transport import Transport

#: ``GET`` of an API server path: the body of a 2xx answer; raises for any other answer or none.
ApiGet = Callable[[str], bytes]

# The oldest Kubernetes minor the driver publishes to (resource.k8s.io/v1beta1; v1, DRA GA, from 1.34).
MIN_MINOR = 32
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


def api_server_checks(settings: ClusterSettings) -> Iterator[CheckResult]:
    """The API server's checks through the endpoint the command loaded (a kubeconfig, or in a pod its service
    account, as ``run`` reaches it); a SKIP without one."""
    if settings.endpoint is None:
        detail = "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod: pass --kubeconfig"
        yield CheckResult("API server", SKIP, f"{detail} to check the API server's version and DRA API")
        return
    from dradriver.plugin.cluster.transport import Transport  # the HTTPS stack only where it is used

    transport = Transport(settings.endpoint)
    try:
        for result in api_server_checks_through(api_getter(transport), mig_mode=settings.mig_mode):
            # Say which configuration was used: the rule may have found one the admin did not think of.
            named = result.name == "API server" and settings.source
            yield replace(result, detail=f"{result.detail} (through {settings.source})") if named else result
    finally:
        transport.close()


def api_getter(transport: Transport) -> ApiGet:
    """``GET`` through ``transport``: the body of a 2xx answer, a RuntimeError naming the status otherwise."""

    def get(path: str) -> bytes:
        response = transport.request("GET", path, timeout=(5.0, 10.0))
        data = response.read()
        if not 200 <= response.status <= 299:
            raise RuntimeError(f"GET {path}: HTTP {response.status}: {data[:200].decode(errors='replace')}")
        return data

    return get


def api_server_checks_through(get: ApiGet, *, mig_mode: str) -> Iterator[CheckResult]:
    """The version, DRA API and feature-gate checks, reading the server through ``get``."""
    yield from api_version_checks(lambda: json.loads(get("/version")), lambda: json.loads(get("/apis")))
    # The `kubernetes_feature_enabled` series of /metrics name every feature gate.
    yield feature_gate_check(lambda: get("/metrics").decode(), mig_mode)


def api_version_checks(get_version: Callable[[], Any], get_groups: Callable[[], Any]) -> Iterator[CheckResult]:
    """The server's version (``GET /version``) and the resource.k8s.io versions it serves (``GET /apis``), both
    as the JSON the server sends."""
    try:
        version, groups = get_version(), get_groups().get("groups") or []
        minor = int("".join(ch for ch in str(version.get("minor", "")) if ch.isdigit()) or 0)
        git_version = str(version.get("gitVersion", "?"))
    except Exception as err:  # no answer, an error status or no JSON: all mean the check cannot be made
        yield CheckResult("API server", FAIL, f"unreachable: {err}", "check --kubeconfig and the network")
        return
    yield (
        CheckResult("API server", OK, f"Kubernetes {git_version}")
        if minor >= MIN_MINOR
        else CheckResult("API server", FAIL, f"Kubernetes {git_version}", f"upgrade to 1.{MIN_MINOR} or newer")
    )
    resource = next((g for g in groups if g.get("name") == "resource.k8s.io"), None)
    served = [str(v.get("version")) for v in resource.get("versions") or []] if resource else []
    yield dra_api_check(served)


def dra_api_check(served: list[str]) -> CheckResult:
    """Whether the server serves a resource.k8s.io version the driver speaks (``served``: the versions it does)."""
    spoken = next((v for v in VERSIONS if v in served), None)
    if spoken == "v1":
        return CheckResult("DRA API", OK, f"resource.k8s.io {', '.join(served)}")
    if spoken is not None:
        return CheckResult(
            "DRA API",
            OK,
            f"resource.k8s.io {', '.join(served)}: the driver speaks {spoken} (Kubernetes 1.32/1.33: no dynamic MIG "
            "on 1.32, no consumable shares before 1.34; docs/publishing.md)",
        )
    return CheckResult(
        "DRA API",
        FAIL,
        f"resource.k8s.io not served in v1, v1beta2 or v1beta1 ({', '.join(served) or 'no versions'})",
        "enable DRA: Kubernetes 1.34+ serves it; on 1.32/1.33 turn on the DynamicResourceAllocation feature gate "
        "and --runtime-config=resource.k8s.io/v1beta1=true (1.33: also resource.k8s.io/v1beta2=true)",
    )


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


def feature_gate_check(read_metrics: Callable[[], str], mig_mode: str) -> CheckResult:
    """The DRA feature gates (:data:`DRA_GATES`) the server reports off: a WARN saying what the driver does
    without each, a FAIL where ``mig_mode`` needs one; a SKIP where ``/metrics`` cannot be read."""
    name = "DRA features"
    try:
        gates = feature_gates(read_metrics())
    except Exception as err:  # 403 for a service account without /metrics, or no answer: the check cannot run
        return CheckResult(
            name,
            SKIP,
            f"cannot read the API server's /metrics ({str(err).splitlines()[0][:120]})",
            "run doctor with a kubeconfig allowed `get` on the non-resource URL /metrics to see its feature gates",
        )
    known = {gate: gates[gate] for gate in DRA_GATES if gate in gates}
    if not known:
        return CheckResult(name, SKIP, "the API server's /metrics names no DRA feature gate")
    off = [gate for gate, enabled in known.items() if not enabled]
    detail = f"on: {', '.join(g for g, e in known.items() if e) or 'none'}"
    if not off:
        return CheckResult(name, OK, detail)
    detail += "; off: " + "; ".join(f"{gate} ({DRA_GATES[gate]})" for gate in off)
    needed = "DRAPartitionableDevices" in off and mig_mode == "dynamic"
    return CheckResult(
        name,
        FAIL if needed else WARN,
        detail,
        "turn DRAPartitionableDevices on (API server and scheduler) or run --mig-mode static"
        if needed
        else "turn the gates on in the API server and scheduler (--feature-gates) where you need what they do",
    )
