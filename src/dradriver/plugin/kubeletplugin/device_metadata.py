"""Device metadata (KEP-5304): per-request JSON files that tell a container about its devices, mounted by CDI.

The kubelet asks for nothing here: the protocol is driver-side only (no API field, no feature gate), and the Go
kubelet-plugin library implements it when a driver enables ``EnableDeviceMetadata``. We follow the published
protocol:

- inside a container the file of request ``<request>`` is
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``, or
  ``…/resourceclaimtemplates/<podClaimName>/<request>/…`` for a claim made from a template (its
  ``resource.kubernetes.io/pod-claim-name`` annotation); ``<request>`` is the base name of a ``req/sub`` request;
- the file holds a ``DeviceMetadata`` object of ``metadata.resource.k8s.io/v1alpha1``: the claim's name,
  namespace, uid and a ``generation`` that grows when the content changes, and per request the devices (driver,
  pool, name, attributes as ``DeviceAttribute`` JSON), with the full request name;
- it is read-only in the container: a CDI spec of kind ``<driver>/metadata`` bind-mounts it, one CDI device per
  request, and that id is added to the devices of that request only, so a container sees the metadata of the
  requests it names.

Files live in the plugin directory (``<plugin-dir>/dra-device-metadata/<claim-uid>/<request>/metadata.json``),
so removing the driver removes them; unprepare deletes them with the CDI spec, also after the feature was turned
off (a writer with ``enabled=False`` writes nothing new but still removes), and start-up removes those of claims
that are no longer prepared (:meth:`DeviceMetadataWriter.remove_unowned`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dradriver.errors import DeviceError
from dradriver.plugin.handler import PreparedDevice
from dradriver.plugin.kubeletplugin.claims import base_request_name
from dradriver.validation.names import is_dns_label

logger = logging.getLogger(__name__)

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
HOST_SUBDIR = "dra-device-metadata"
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


class DeviceMetadataWriter:
    """Writes and removes the metadata files and their CDI spec for prepared claims of ``driver_name``.

    With ``enabled=False`` (``--device-metadata`` turned off) :meth:`write` adds nothing, but what an earlier
    run wrote is still removed at unprepare and by :meth:`remove_unowned`."""

    def __init__(self, *, driver_name: str, plugin_dir: Path, cdi_dir: Path, enabled: bool = True) -> None:
        self.driver_name = driver_name
        self.root = plugin_dir / HOST_SUBDIR
        self.cdi_dir = cdi_dir
        self.enabled = enabled

    @property
    def cdi_kind(self) -> str:
        return f"{self.driver_name}/metadata"

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.driver_name}-metadata_{claim_uid}.json"

    def write(self, claim: Mapping[str, Any], devices: Sequence[PreparedDevice]) -> tuple[PreparedDevice, ...]:
        """Write the claim's metadata files and CDI spec; return ``devices`` with the metadata CDI id of each of
        their requests added. Raises :class:`DeviceError` when a file cannot be written."""
        if not self.enabled:
            return tuple(devices)
        meta = claim["metadata"]
        uid = str(meta["uid"])
        by_request = self._devices_by_request(claim, devices)
        base_requests = _base_requests(meta, by_request)
        if not base_requests:
            return tuple(devices)
        try:
            cdi_devices = [
                self._write_request_file(meta, base, {name: by_request[name] for name in full_names})
                for base, full_names in base_requests.items()
            ]
            # Device names made from a UID may start with a digit, which CDI allows from 0.5.0 on.
            version = "0.5.0" if uid[:1].isdigit() else "0.3.0"
            _write_json(self.spec_path(uid), {"cdiVersion": version, "kind": self.cdi_kind, "devices": cdi_devices})
        except OSError as err:
            raise DeviceError(
                f"unable to write the device metadata of claim {meta.get('namespace')}/{meta['name']} ({uid}): "
                f"{err}; check that the plugin directory and --cdi-dir are writable"
            ) from err
        return tuple(self._with_metadata_ids(device, uid, base_requests) for device in devices)

    def _devices_by_request(
        self, claim: Mapping[str, Any], devices: Sequence[PreparedDevice]
    ) -> dict[str, list[dict[str, Any]]]:
        """Full request name → the metadata of the devices of this driver allocated for it and prepared."""
        prepared = {(d.pool, d.device): d for d in devices}
        by_request: dict[str, list[dict[str, Any]]] = {}
        results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        for result in results:
            device = prepared.get((result.get("pool"), result.get("device")))
            if result.get("driver") != self.driver_name or device is None:
                continue
            entry: dict[str, Any] = {"driver": self.driver_name, "pool": device.pool, "name": device.device}
            if device.metadata:
                entry["attributes"] = dict(device.metadata)
            by_request.setdefault(str(result["request"]), []).append(entry)
        return by_request

    def _write_request_file(
        self, meta: Mapping[str, Any], base: str, requests: Mapping[str, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Write the metadata file of request ``base`` (``requests``: its full names, ``req/sub``, and their
        devices); return the CDI device that mounts it where the container looks for it."""
        uid = str(meta["uid"])
        host_file = self.root / uid / base / "metadata.json"
        document: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "DeviceMetadata",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", ""), "uid": uid},
        }
        pod_claim = (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION)
        if pod_claim:
            document["podClaimName"] = pod_claim
        document["requests"] = [{"name": name, "devices": found} for name, found in requests.items()]
        document["metadata"]["generation"] = _generation(host_file, document)
        _write_json(host_file, document)
        scope = f"resourceclaimtemplates/{pod_claim}" if pod_claim else f"resourceclaims/{meta['name']}"
        container_file = f"{CONTAINER_DIR}/{scope}/{base}/{self.driver_name}-metadata.json"
        return {
            "name": f"{uid}_{base}",
            "containerEdits": {
                "mounts": [{"hostPath": str(host_file), "containerPath": container_file, "options": ["ro", "bind"]}]
            },
        }

    def _with_metadata_ids(
        self, device: PreparedDevice, uid: str, base_requests: Mapping[str, list[str]]
    ) -> PreparedDevice:
        """``device`` with the metadata CDI id of each of its requests that has metadata added."""
        ids = (f"{self.cdi_kind}={uid}_{base}" for base in dict.fromkeys(device.requests) if base in base_requests)
        return replace(device, cdi_device_ids=(*device.cdi_device_ids, *ids))

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's metadata files and CDI spec; nothing there is fine."""
        try:
            self.spec_path(claim_uid).unlink(missing_ok=True)
            if (self.root / claim_uid).exists():
                shutil.rmtree(self.root / claim_uid)
        except OSError as err:
            raise DeviceError(f"unable to remove the device metadata of claim {claim_uid}: {err}") from err

    def claim_uids(self) -> set[str]:
        """The claims that have a metadata CDI spec or metadata files here."""
        prefix, suffix = f"{self.driver_name}-metadata_", ".json"
        uids: set[str] = set()
        with contextlib.suppress(FileNotFoundError):
            uids.update(
                p.name[len(prefix) : -len(suffix)]
                for p in self.cdi_dir.iterdir()
                if p.name.startswith(prefix) and p.name.endswith(suffix)
            )
        with contextlib.suppress(FileNotFoundError):
            uids.update(p.name for p in self.root.iterdir() if p.is_dir())
        # Only names a claim UID can have: nothing else here is ours to delete.
        return {uid for uid in uids if _UID.fullmatch(uid)}

    def remove_unowned(self, prepared: Collection[str]) -> list[str]:
        """At start-up: remove the metadata of every claim not in ``prepared`` (left by a crash between unprepare
        and the removal, or by a claim dropped while the plugin was down); return their UIDs.

        The metadata of a claim still prepared stays even when writing is off: its containers may be restarted
        with the CDI ids the kubelet cached at prepare, which must still resolve. It goes at its unprepare."""
        removed = sorted(self.claim_uids() - set(prepared))
        for uid in removed:
            self.remove(uid)
        return removed


def _base_requests(meta: Mapping[str, Any], by_request: Mapping[str, Any]) -> dict[str, list[str]]:
    """Base request name (``req`` of ``req/sub``) → its full names. A base name that is not a DNS label is refused:
    it names a directory of the claim's metadata, so it must not name any other path."""
    base_requests: dict[str, list[str]] = {}
    for request in by_request:
        base = base_request_name(request)
        if not is_dns_label(base):
            raise DeviceError(
                f"claim {meta.get('namespace')}/{meta.get('name')}: request name {base[:80]!r} is not a DNS label, "
                "so it cannot name the request's device metadata directory"
            )
        base_requests.setdefault(base, []).append(request)
    return base_requests


def _generation(path: Path, document: Mapping[str, Any]) -> int:
    """1 for a new file; the old generation when the content is unchanged; one more when it changed."""
    try:
        old = json.loads(path.read_text())
        old_generation = int(old["metadata"]["generation"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1
    old["metadata"].pop("generation", None)
    new = json.loads(json.dumps(document))
    new["metadata"].pop("generation", None)
    return old_generation if old == new else old_generation + 1


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Atomically (a reader sees the old or the new file), readable by everyone (containers run as any user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=2)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
