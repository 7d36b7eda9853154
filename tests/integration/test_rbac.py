"""The ClusterRole grants exactly what `dradriver run` calls: every request a running driver makes (publish,
update, delete obsolete slices, watch, prepare, remove the node labels an earlier run wrote) is allowed by a rule,
and every verb the role grants is used."""

from __future__ import annotations

from pathlib import Path

import yaml
from support.apiserver import FakeApiServer, RequestRecord

from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from integration.test_run_process import NODE, TIMEOUT, DriverProcess, allocated_claim

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.dradriver.dev"
LABELS = f"{DRIVER}/node-labels"


def granted() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of the plugin's ClusterRole."""
    docs = yaml.safe_load_all((ROOT / "manifests/driver/rbac.yaml").read_text())
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def authorization(record: RequestRecord) -> tuple[str, str, str] | None:
    """The RBAC (apiGroup, resource, verb) a request needs, as the API server's request-info resolver derives
    it; None for non-resource URLs such as /version (readable by every user through system:public-info-viewer) and
    API discovery."""
    parts = [p for p in record.path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None  # /apis/<group>[/<version>] is discovery, which system:discovery lets every user read
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "watch" if record.watch else ("get" if named else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[record.method]
    return group, resource, verb


def test_the_role_is_exactly_what_the_driver_calls(root: Path) -> None:
    with FakeApiServer() as api:
        # An earlier run's node labels (nodeLabels turned off since): --node-labels none removes them.
        earlier = {"labels": {"nvidia.com/gpu.present": "true"}, "annotations": {LABELS: "nvidia.com/gpu.present"}}
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, **earlier}})
        # A slice left from an older pool layout: the driver must delete it.
        api.create(
            "resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": "leftover"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": "old-pool", "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            },
        )
        driver = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"))
        try:
            driver.wait_ready()

            def node_metadata() -> dict:
                return (api.get("nodes", NODE) or {}).get("metadata", {})

            assert api.wait_until(lambda: not node_metadata().get("labels"), TIMEOUT), driver.log
            assert LABELS not in node_metadata().get("annotations", {})

            def ours() -> list[dict]:
                return [s for s in api.list("resourceslices") if s["spec"]["driver"] == DRIVER]

            assert api.wait_until(lambda: [s["spec"]["pool"]["name"] for s in ours()] == [NODE], TIMEOUT)
            # Someone edits our slice: the driver puts it back with an update.
            [published] = ours()
            published["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
            api.replace("resourceslices", published)
            assert api.wait_until(
                lambda: ours()[0]["spec"]["devices"][0]["attributes"]["productName"]["string"] != "tampered", TIMEOUT
            ), driver.log
            claim = allocated_claim(api, "one", ["gpu-0000-07-00-0"])

            def status_devices() -> list[dict]:
                return (api.get("resourceclaims", "one", "default") or {}).get("status", {}).get("devices", [])

            with KubeletClient(root / "registry").register() as plugin:
                assert plugin.prepare([claim])[claim.uid].error == ""
                assert api.wait_until(lambda: len(status_devices()) == 1, TIMEOUT), driver.log
        finally:
            driver.stop()
        used = {a for r in api.requests if r.authorized and (a := authorization(r)) is not None}
    # The API server (1.36+) derives this check from a node's status.devices write; no request names it.
    if ("resource.k8s.io", "resourceclaims/status", "patch") in used:
        used.add(("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"))
    assert used == granted()
