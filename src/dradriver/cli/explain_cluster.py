"""``dradriver explain --pod NS/NAME``: why is this pod Pending? Reads the cluster (read-only)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Protocol

from dradriver.cli.explain import (
    EXIT_DOES_NOT_FIT,
    EXIT_FITS,
    ClaimOutcome,
    explain_document,
    render_outcome,
)
from dradriver.cli.explain_input import Document
from dradriver.errors import ConfigError

GROUP, VERSION = "resource.k8s.io", "v1"


class ClusterReader(Protocol):
    """The read-only cluster access ``--pod`` needs; every object is returned as its JSON dict."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_device_classes(self) -> list[dict[str, Any]]: ...

    def list_resource_slices(self) -> list[dict[str, Any]]: ...

    def list_claims(self) -> list[dict[str, Any]]: ...


class KubernetesReader:
    """ClusterReader over the ``kubernetes`` client (GET and LIST only)."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        import kubernetes

        # The client's stubs are partial; treat it as untyped here, at the edge.
        client: Any = kubernetes.client
        config: Any = kubernetes.config
        try:
            if kubeconfig or context:
                config.load_kube_config(config_file=kubeconfig, context=context)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise ConfigError(f"cannot load cluster credentials: {err}; pass --kubeconfig/--context") from err
        self._api: Any = client.ApiClient()
        self._core = client.CoreV1Api(self._api)
        self._custom: Any = client.CustomObjectsApi(self._api)
        self._errors = client.exceptions.ApiException

    def _get(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except self._errors as err:
            if err.status == 404:
                return None
            raise ConfigError(f"reading {plural} {namespace}/{name}: {err.status} {err.reason}") from err
        return result

    def _list(self, plural: str) -> list[dict[str, Any]]:
        try:
            result = self._custom.list_cluster_custom_object(GROUP, VERSION, plural)
        except self._errors as err:
            raise ConfigError(f"listing {plural}: {err.status} {err.reason}") from err
        kind = {
            "deviceclasses": "DeviceClass",
            "resourceslices": "ResourceSlice",
            "resourceclaims": "ResourceClaim",
        }[plural]
        return [
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, **item} for item in result.get("items", [])
        ]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except self._errors as err:
            raise ConfigError(f"reading pod {namespace}/{name}: {err.status} {err.reason}") from err
        result: dict[str, Any] = self._api.sanitize_for_serialization(pod)
        return result

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(namespace, "resourceclaims", name)

    def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(namespace, "resourceclaimtemplates", name)

    def list_device_classes(self) -> list[dict[str, Any]]:
        return self._list("deviceclasses")

    def list_resource_slices(self) -> list[dict[str, Any]]:
        return self._list("resourceslices")

    def list_claims(self) -> list[dict[str, Any]]:
        return self._list("resourceclaims")


def pod_claims(reader: ClusterReader, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(pod claim name, claim or template object or None, note) for every entry of spec.resourceClaims."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    found = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = str(entry.get("name"))
        if entry.get("resourceClaimName"):
            claim = reader.get_claim(namespace, entry["resourceClaimName"])
            note = "" if claim else f"ResourceClaim {namespace}/{entry['resourceClaimName']} does not exist"
            found.append((name, claim, note))
        elif entry.get("resourceClaimTemplateName"):
            generated = statuses.get(name)
            claim = reader.get_claim(namespace, generated) if generated else None
            if claim is None:
                template = reader.get_claim_template(namespace, entry["resourceClaimTemplateName"])
                note = (
                    ""
                    if template
                    else f"ResourceClaimTemplate {namespace}/{entry['resourceClaimTemplateName']} is missing"
                )
                found.append((name, template, note))
            else:
                found.append((name, claim, ""))
    return found


def explain_pod_with(reader: ClusterReader, pod_ref: str, output: str) -> int:
    namespace, _, name = pod_ref.rpartition("/")
    if not name:
        raise ConfigError(f"--pod {pod_ref!r}: want NAMESPACE/NAME")
    pod = reader.get_pod(namespace or "default", name)
    claims = pod_claims(reader, pod)
    if not claims:
        print(f"pod {pod_ref} has no spec.resourceClaims: DRA is not why it is Pending")
        return EXIT_FITS
    classes = reader.list_device_classes()
    slices = reader.list_resource_slices()
    all_claims = reader.list_claims()
    results = []
    fits = True
    for pod_claim, obj, note in claims:
        if obj is None:
            results.append({"podClaim": pod_claim, "fits": False, "error": note})
            fits = False
            continue
        uid = (obj.get("metadata") or {}).get("uid")
        allocation = (obj.get("status") or {}).get("allocation")
        if allocation:
            results.append({"podClaim": pod_claim, "fits": True, "allocated": allocation})
            continue
        others = [
            c
            for c in all_claims
            if (c.get("status") or {}).get("allocation") and (c.get("metadata") or {}).get("uid") != uid
        ]
        doc = Document(obj, f"pod {pod_ref} claim {pod_claim}")
        outcome = explain_document(doc, slices=slices, classes=classes, allocated=others, node=None)
        fits = fits and outcome.fits
        results.append({"podClaim": pod_claim, "outcome": outcome})
    _render_pod(pod_ref, results, output)
    return EXIT_FITS if fits else EXIT_DOES_NOT_FIT


def _render_pod(pod_ref: str, results: list[dict[str, Any]], output: str) -> None:
    if output == "json":
        rendered = []
        for result in results:
            outcome: ClaimOutcome | None = result.get("outcome")
            if outcome is None:
                rendered.append(result)
                continue
            rendered.append(
                {
                    "podClaim": result["podClaim"],
                    "fits": outcome.fits,
                    "node": outcome.node,
                    "error": outcome.error,
                    "report": outcome.report.to_dict() if outcome.report else None,
                    "otherNodes": outcome.other_nodes,
                }
            )
        json.dump({"pod": pod_ref, "claims": rendered}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(f"pod {pod_ref}:")
    for result in results:
        outcome = result.get("outcome")
        if outcome is not None:
            print(render_outcome(outcome))
        elif result.get("allocated"):
            print(f"claim {result['podClaim']}: already allocated")
        else:
            print(f"claim {result['podClaim']}: {result['error']}")


def explain_pod(args: argparse.Namespace) -> int:
    reader = KubernetesReader(args.kubeconfig, args.context)
    return explain_pod_with(reader, args.pod, args.output)
