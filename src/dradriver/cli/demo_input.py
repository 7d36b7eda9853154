"""What ``dradriver demo`` reads: the claim it allocates (from ``--claim``, or its own example) and the DeviceClasses
the claim may name (``--classes``, or the chart's), each checked as the API server checks it.

A file with no claim but a Pod asking for a DeviceClass's extended resource (``nvidia.com/gpu: 1``) gets the claim
the scheduler makes for that pod (KEP-5004), so a device-plugin style manifest demos too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.cli.explain_input import Document, Inputs, chart_classes, check_claim, check_class, load
from dradriver.driver.prepare.presets import PRESETS
from dradriver.errors import ConfigError
from dradriver.inputs import InputError, load_yaml_file

#: What a claim file may hold besides its claims (the Pods and Deployments beside them are skipped).
CLAIM_FILE_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourceSlice")
#: The extended resource every DeviceClass stands for, besides the one its ``extendedResourceName`` names.
IMPLICIT_EXTENDED_RESOURCE = "deviceclass.resource.kubernetes.io/"


def default_claim(driver: str, gpu_class: str) -> dict[str, Any]:
    """Two whole GPUs that share an NVLink domain: what a user would write for a 2-GPU training job."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-nvlinked-gpus", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": gpu_class, "count": 2}}],
                "constraints": [{"requests": ["gpus"], "matchAttribute": f"{driver}/nvlinkDomain"}],
            }
        },
    }


@dataclass(frozen=True)
class Classes:
    """DeviceClasses, and where they came from (said in demo's output)."""

    objects: list[dict[str, Any]]
    origin: str

    @property
    def names(self) -> set[str]:
        return {str(c["metadata"]["name"]) for c in self.objects}


def load_classes(paths: list[str], compat: str) -> Classes:
    """The DeviceClasses of ``--classes`` (each checked as the API server checks it), or the chart's."""
    if not paths:
        chart = "the chart's" + (" with compat: nvidia" if compat == "nvidia" else "")
        return Classes(chart_classes(compat), f"{chart} (--classes FILE|DIR for your cluster's)")
    inputs = Inputs()
    load(paths, inputs, want=("DeviceClass",))
    problems = inputs.errors + [p for doc in inputs.of_kind("DeviceClass") for p in check_class(doc)]
    if problems:
        raise ConfigError(f"--classes {problems[0]}")
    if not inputs.documents:
        raise ConfigError(f"--classes {', '.join(paths)}: no DeviceClass there; give your cluster's DeviceClasses")
    return Classes([doc.obj for doc in inputs.documents], f"from --classes {', '.join(paths)}")


@dataclass(frozen=True)
class LoadedClaim:
    """The claim to allocate (a ResourceClaim, made from a template or a pod where the file holds one), where it
    came from, and the DeviceClasses with those of the file added."""

    claim: dict[str, Any]
    source: str
    classes: Classes


def load_claim(path: str, classes: Classes, *, driver_name: str) -> LoadedClaim:
    """The first ResourceClaim of the file (or a claim made from its first ResourceClaimTemplate, or else for the
    extended resources of its first Pod that asks for some), checked as the API server would check it."""
    inputs = Inputs()
    load([path], inputs, want=CLAIM_FILE_KINDS)
    if inputs.errors:
        raise ConfigError(f"--claim {inputs.errors[0]}")
    classes = _with_classes_of(inputs.of_kind("DeviceClass"), classes)
    documents = inputs.of_kind("ResourceClaim", "ResourceClaimTemplate")
    if documents:  # checked as written: the messages name the fields of the file
        loaded, checked = _from_document(documents, classes), documents[0]
    else:
        loaded = _from_pod(Path(path), classes)
        checked = Document(loaded.claim, loaded.source)
    problems = check_claim(checked, classes.names, driver_name=driver_name)
    if problems:
        raise ConfigError(f"--claim {problems[0]}{_compat_hint(problems[0], driver_name)}")
    return loaded


def _from_document(documents: list[Document], classes: Classes) -> LoadedClaim:
    """A claim of the file's first ResourceClaim or ResourceClaimTemplate (``<template>-demo``)."""
    document = documents[0]
    source = document.source + (f" (the first of its {len(documents)} claims)" if len(documents) > 1 else "")
    if document.kind == "ResourceClaim":
        return LoadedClaim(dict(document.obj), source, classes)
    metadata = document.obj["metadata"]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{metadata['name']}-demo", "namespace": metadata["namespace"]},
        "spec": document.obj["spec"]["spec"],
    }
    return LoadedClaim(claim, f"ResourceClaimTemplate {document.name} of {source}", classes)


def _from_pod(path: Path, classes: Classes) -> LoadedClaim:
    """The claim the scheduler makes for the first pod (or pod template) of the file whose containers' limits name
    a DeviceClass's extended resource; a ConfigError when there is none."""
    try:
        documents = load_yaml_file(path) if path.is_file() else []
    except InputError as err:
        raise ConfigError(f"--claim {err}") from None
    for number, document in enumerate(documents, start=1):
        claim = extended_resource_claim(document, classes.objects)
        if claim is not None:
            pod = f"{claim['metadata']['namespace']}/{document.get('metadata', {}).get('name')}"
            source = f"the extended resources of {document.get('kind')} {pod} in {path} #{number} (KEP-5004)"
            return LoadedClaim(claim, source, classes)
    raise ConfigError(
        f"--claim {path}: no ResourceClaim or ResourceClaimTemplate in the file, and no Pod whose limits ask for a "
        "DeviceClass's extended resource"
    )


def extended_resource_claim(document: Any, classes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a Pod (or an object with a pod template) whose containers' limits ask for the extended resource of one
    of ``classes`` (its ``extendedResourceName``, or ``deviceclass.resource.kubernetes.io/<class>``), the claim
    the scheduler makes for it: one request per container and resource, that many devices of the class. None
    when it asks for none."""
    spec = _pod_spec(document)
    if spec is None:
        return None
    by_resource = {f"{IMPLICIT_EXTENDED_RESOURCE}{c['metadata']['name']}": c["metadata"]["name"] for c in classes}
    by_resource |= {
        c["spec"]["extendedResourceName"]: c["metadata"]["name"]
        for c in classes
        if isinstance(c.get("spec"), dict) and c["spec"].get("extendedResourceName")
    }
    requests = []
    for i, container in enumerate(c for c in spec.get("containers") or () if isinstance(c, dict)):
        limits = (container.get("resources") or {}).get("limits") or {}
        for j, (resource, quantity) in enumerate(sorted(limits.items())):
            if resource in by_resource:
                count = _whole_number(quantity, f"{resource} limit of container {container.get('name')}")
                exactly = {"deviceClassName": by_resource[resource], "count": count}
                requests.append({"name": f"container-{i}-request-{j}", "exactly": exactly})
    if not requests:
        return None
    metadata = document.get("metadata") or {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{metadata.get('name')}-extended-resources",
            "namespace": metadata.get("namespace") or "default",
        },
        "spec": {"devices": {"requests": requests}},
    }


def _pod_spec(document: Any) -> dict[str, Any] | None:
    """A Pod's spec, or the pod template's of a Deployment, Job and the like."""
    if not isinstance(document, dict) or not isinstance(document.get("spec"), dict):
        return None
    spec = document["spec"]
    if document.get("kind") != "Pod":
        spec = (spec.get("template") or {}).get("spec")
    return spec if isinstance(spec, dict) else None


def _whole_number(quantity: Any, what: str) -> int:
    """An extended resource's limit: a whole number of devices, more than zero."""
    text = str(quantity)
    if not text.isdigit() or int(text) == 0:
        raise ConfigError(f"--claim: the {what} is {quantity!r}; extended resources count whole devices, 1 or more")
    return int(text)


def _with_classes_of(documents: list[Document], classes: Classes) -> Classes:
    """``classes`` with the DeviceClasses of the claim file added (one of the same name replaced)."""
    if not documents:
        return classes
    problems = [p for doc in documents for p in check_class(doc)]
    if problems:
        raise ConfigError(f"--claim {problems[0]}")
    added = {doc.obj["metadata"]["name"]: doc.obj for doc in documents}
    kept = [c for c in classes.objects if c["metadata"]["name"] not in added]
    return Classes(kept + list(added.values()), f"{classes.origin}, and {len(added)} from the --claim file")


def _compat_hint(problem: str, driver_name: str) -> str:
    """Where a claim names a class of NVIDIA's driver that this run does not have: how to get it."""
    nvidia = PRESETS["nvidia"]
    if driver_name == nvidia.driver_name:
        return ""
    if any(f"DeviceClass {name} does not exist" in problem for name in (nvidia.gpu_class, nvidia.mig_class)):
        return " (a class of NVIDIA's driver: add --compat nvidia)"
    return ""
