"""The checkpoint: the one record of what is prepared on this node, and of every change made to get there.

A JSON file in the state directory, rewritten atomically after each change (temp file, fsync, rename, fsync of
the directory), so a crash leaves either the old or the new content. Layout (docs/mig.md describes it fully)::

    {"kind": "dradriver-checkpoint", "version": "1.0", "checksum": "sha256:<hex>", "data": {
        "bootId": "...",
        "claims": {"<uid>": {"namespace": ..., "name": ..., "state": "PrepareStarted" | "PrepareCompleted",
                             "devices": [...], "actions": [...], "rollbackError": ...}}}}

The checksum covers ``data`` exactly as written, unknown fields included, so a field added by a newer version
never breaks an older reader's checksum. Compatibility: the same major version with a newer minor is read, and
fields this version does not know are kept when it rewrites the file; an unknown major version is refused and
the file left untouched; a corrupt file is moved aside (one log line) and the node's state is rebuilt from the
hardware and the API server by start-up reconciliation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dradriver.atomic_files import storage_fix
from dradriver.errors import ConfigError, DeviceError, DradriverError
from dradriver.plugin.handler import ClaimConsumer
from dradriver.plugin.kubeletplugin.claims import consumers
from dradriver.plugin.kubeletplugin.lifecycle import InstanceLock

log = logging.getLogger(__name__)

KIND = "dradriver-checkpoint"
MAJOR_VERSION = 1
MINOR_VERSION = 0
FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"  # changes may be half done: finish or roll back before anything else
    PREPARE_COMPLETED = "PrepareCompleted"


class CheckpointVersionError(ConfigError):
    """The checkpoint was written by an incompatible (unknown major) version of the driver."""


class CorruptCheckpoint(Exception):
    """The checkpoint cannot be read as one (bad JSON, wrong kind, checksum mismatch, malformed entry)."""


def _split(raw: Any, known: set[str], what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(raw, dict):
        raise CorruptCheckpoint(f"{what} is {type(raw).__name__}, not an object")
    return {k: v for k, v in raw.items() if k in known}, {k: v for k, v in raw.items() if k not in known}


@dataclass
class Action:
    """One change made for a claim, recorded before it is made (``done`` False: the intent) and after
    (``done`` True, with its result in ``params``). It holds everything its undo needs."""

    step: str  # names the step kind, e.g. "gpu-instance"; the driver maps it to an undo
    device: str  # the device it was done for ("" for claim-wide steps such as the CDI spec)
    params: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "step": self.step, "device": self.device, "params": self.params, "done": self.done}

    @classmethod
    def from_json(cls, raw: Any) -> Action:
        known, extra = _split(raw, {"step", "device", "params", "done"}, "an action")
        if not isinstance(known.get("step"), str) or not isinstance(known.get("params", {}), dict):
            raise CorruptCheckpoint(f"action {raw!r} lacks a step name or has params that are not an object")
        return cls(
            step=known["step"],
            device=str(known.get("device", "")),
            params=dict(known.get("params", {})),
            done=bool(known.get("done", False)),
            extra=extra,
        )


@dataclass
class DeviceRecord:
    """One device of a claim and what it became on the hardware."""

    name: str
    requests: list[str]
    gpu: str  # the (parent) GPU's device name
    gpu_uuid: str
    kind: str  # "gpu" or "mig"
    admin_access: bool = False
    placement_start: int | None = None  # MIG: memory slices covered
    placement_size: int | None = None
    profile_id: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_uuid: str | None = None
    previous_mig_mode: bool | None = None  # the parent's MIG mode before this claim changed it (None: unchanged)
    cdi_device_ids: list[str] = field(default_factory=list)
    status_data: dict[str, Any] | None = None  # what the claim's status reports about the device
    metadata: dict[str, Any] | None = None  # the device's attributes for its metadata file
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = {
        "name": "name",
        "requests": "requests",
        "gpu": "gpu",
        "gpuUUID": "gpu_uuid",
        "kind": "kind",
        "adminAccess": "admin_access",
        "placementStart": "placement_start",
        "placementSize": "placement_size",
        "profileId": "profile_id",
        "gpuInstanceId": "gpu_instance_id",
        "computeInstanceId": "compute_instance_id",
        "migUUID": "mig_uuid",
        "previousMigMode": "previous_mig_mode",
        "cdiDeviceIds": "cdi_device_ids",
        "statusData": "status_data",
        "metadata": "metadata",
    }

    @property
    def slices(self) -> range:
        """Memory slices the device covers: a partition's placement, or all of a whole GPU."""
        if self.placement_start is None or self.placement_size is None:
            return range(0, 1 << 16)
        return range(self.placement_start, self.placement_start + self.placement_size)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        for key, attr in self._FIELDS.items():
            value = getattr(self, attr)
            if value is not None:
                out[key] = list(value) if isinstance(value, list) else value
        return out

    @classmethod
    def from_json(cls, raw: Any) -> DeviceRecord:
        known, extra = _split(raw, set(cls._FIELDS), "a device")
        missing = [k for k in ("name", "gpu", "gpuUUID", "kind") if not isinstance(known.get(k), str)]
        if missing:
            raise CorruptCheckpoint(f"device {raw!r} lacks {', '.join(missing)}")
        values = {attr: known[key] for key, attr in cls._FIELDS.items() if key in known}
        values["requests"] = [str(r) for r in values.get("requests", [])]
        values["cdi_device_ids"] = [str(r) for r in values.get("cdi_device_ids", [])]
        return cls(**values, extra=extra)


@dataclass
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: list[DeviceRecord] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    rollback_error: str | None = None  # set when undoing failed; start-up (or the next prepare) finishes it
    # The claim's status.reservedFor as last seen (at prepare, or by the periodic check): the pods for metrics.
    reserved_for: list[ClaimConsumer] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (UID {self.uid})"

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.extra,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [d.to_json() for d in self.devices],
            "actions": [a.to_json() for a in self.actions],
        }
        if self.rollback_error is not None:
            out["rollbackError"] = self.rollback_error
        if self.reserved_for:
            out["reservedFor"] = [_consumer_json(c) for c in self.reserved_for]
        return out

    @classmethod
    def from_json(cls, uid: str, raw: Any) -> ClaimRecord:
        known, extra = _split(
            raw, {"namespace", "name", "state", "devices", "actions", "rollbackError", "reservedFor"}, "a claim"
        )
        try:
            state = ClaimState(str(known.get("state")))
        except ValueError as err:
            raise CorruptCheckpoint(f"claim {uid}: unknown state {known.get('state')!r}") from err
        devices, actions = known.get("devices", []), known.get("actions", [])
        if not isinstance(devices, list) or not isinstance(actions, list):
            raise CorruptCheckpoint(f"claim {uid}: devices and actions must be lists")
        rollback_error = known.get("rollbackError")
        return cls(
            uid=uid,
            namespace=str(known.get("namespace", "")),
            name=str(known.get("name", "")),
            state=state,
            devices=[DeviceRecord.from_json(d) for d in devices],
            actions=[Action.from_json(a) for a in actions],
            rollback_error=str(rollback_error) if rollback_error is not None else None,
            reserved_for=list(consumers(known.get("reservedFor"))),
            extra=extra,
        )


def _consumer_json(consumer: ClaimConsumer) -> dict[str, str]:
    out = {"resource": consumer.resource, "name": consumer.name, "uid": consumer.uid}
    if consumer.api_group:
        out["apiGroup"] = consumer.api_group
    return out


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's id; a checkpoint from another boot describes hardware state that did not survive it."""
    try:
        return path.read_text().strip()
    except OSError as err:
        log.warning(
            "cannot read the boot id; a checkpoint from an earlier boot will not be recognised path=%s error=%s",
            path,
            err,
        )
        return ""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def checksum(data: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data).encode()).hexdigest()


class CheckpointStore:
    """Claim records, kept in memory and written through to ``<state_dir>/checkpoint.json``.

    ``state_dir`` None keeps them in memory only (tests, the demo). Thread-safe; records are stored in their
    JSON form, so a caller's record object is never shared with another thread. ``open`` takes an exclusive
    lock on the directory, so two driver processes can never both own one checkpoint.
    """

    def __init__(self, state_dir: Path | None = None, *, boot_id: str = "") -> None:
        self.state_dir = state_dir
        self.boot_id = boot_id
        self._lock = threading.Lock()
        # Each claim as its canonical JSON text: a write joins them (no re-encoding of the other claims), a read
        # parses one (a private copy, so a caller's record is never shared with another thread).
        self._claims: dict[str, str] = {}
        self._parsed: dict[tuple[str, str], ClaimRecord] = {}  # read-only views for insert_checked
        self._unwritten: set[str] = set()  # claims stored with durable=False and not in the file yet
        self._extra: dict[str, Any] = {}
        self._file_lock: InstanceLock | None = None
        self._stamp: tuple[int, int, int] | None = None  # of the file as last read or written
        #: Claims dropped at load because the checkpoint is from an earlier boot (reconciliation logs them).
        self.discarded: list[ClaimRecord] = []

    @property
    def path(self) -> Path | None:
        return self.state_dir / FILE_NAME if self.state_dir is not None else None

    @classmethod
    def open(cls, state_dir: Path, *, boot_id: str | None = None, shared: bool = False) -> CheckpointStore:
        """Load the checkpoint in ``state_dir`` (see the module docstring for what happens to bad files).

        Unless ``shared``, the directory is locked for this process. ``shared`` is for rolling updates, where the
        old and the new driver pod serve at once: they serialise every prepare, unprepare and reconciliation
        with a lock of their own, and the store re-reads the file whenever another process rewrote it."""
        store = cls(state_dir, boot_id=read_boot_id() if boot_id is None else boot_id)
        if not shared:
            store._acquire()
            for tmp in state_dir.glob(f".{FILE_NAME}.*.tmp"):  # a write a crash cut short; never renamed into place
                tmp.unlink(missing_ok=True)
        try:
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        if self._file_lock is not None:
            self._file_lock.release()
            self._file_lock = None

    def _acquire(self) -> None:
        assert self.state_dir is not None
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create state directory {self.state_dir}: {err}; check --state-dir") from err
        lock = InstanceLock(self.state_dir / LOCK_NAME)
        lock.acquire(f"the driver whose checkpoint is in {self.state_dir}")
        self._file_lock = lock

    def _load(self) -> None:
        path = self.path
        assert path is not None
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as err:
            self._move_aside(path, f"unreadable ({err})")
            return
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("kind") != KIND:
                raise CorruptCheckpoint(f"kind is not {KIND!r}")
            major, minor = _version(doc.get("version"))
        except (ValueError, CorruptCheckpoint) as err:
            self._move_aside(path, str(err))
            return
        if major != MAJOR_VERSION:
            raise CheckpointVersionError(
                f"checkpoint {path} has format version {major}.{minor}, which this driver (format "
                f"{MAJOR_VERSION}.{MINOR_VERSION}) cannot read; run the driver version that wrote it, or one that "
                "reads it, to unprepare its claims; the file was left untouched"
            )
        try:
            data = doc.get("data")
            if not isinstance(data, dict) or doc.get("checksum") != checksum(data):
                raise CorruptCheckpoint("checksum mismatch")
            known, extra = _split(data, {"bootId", "claims"}, "data")
            claims = known.get("claims", {})
            if not isinstance(claims, dict):
                raise CorruptCheckpoint("claims is not an object")
            records = {uid: ClaimRecord.from_json(uid, raw) for uid, raw in claims.items()}
        except CorruptCheckpoint as err:
            self._move_aside(path, str(err))
            return
        if minor > MINOR_VERSION:
            log.info(
                "checkpoint from a newer minor format version; its unknown fields are kept version=%d.%d", major, minor
            )
        self._extra = extra
        file_boot = str(known.get("bootId", ""))
        if file_boot and self.boot_id and file_boot != self.boot_id:
            # The node rebooted: MIG instances and CDI specs (on tmpfs) did not survive it.
            self.discarded = list(records.values())
            log.warning(
                "checkpoint is from an earlier boot; discarding it claims=%d file_boot_id=%s boot_id=%s",
                len(records),
                file_boot,
                self.boot_id,
            )
            self._save()
            return
        self._claims = {uid: _canonical(r.to_json()) for uid, r in records.items()}
        self._stamp = _file_stamp(path)

    def _refresh(self) -> None:
        """Re-read the file if another process rewrote it (rolling updates; see ``open``)."""
        path = self.path
        if path is None:
            return
        stamp = _file_stamp(path)
        if stamp == self._stamp:
            return
        if stamp is None and self._stamp is not None:
            self._write_back_deleted()
            return
        self._claims, self._extra, self._unwritten = {}, {}, set()
        self._load()

    def _write_back_deleted(self) -> None:
        """The file we wrote is gone: someone deleted it or its directory (the plugin directory, the default
        state directory). No driver process deletes it, so memory is what the node has: write it back (with
        the directory and its lock), rather than forget every prepared claim. A failed write is retried at the
        next access."""
        assert self.state_dir is not None
        log.warning("checkpoint was deleted under the running driver; writing it back path=%s", self.path)
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self._file_lock is not None:
                self._file_lock.renew(f"the driver whose checkpoint is in {self.state_dir}")
            self._save()
        except (OSError, DradriverError) as err:
            log.error("cannot write the checkpoint back; retrying at its next use path=%s error=%s", self.path, err)

    def ensure_written(self) -> None:
        """Write the checkpoint back if it was deleted (see ``_write_back_deleted``); a no-op otherwise."""
        with self._lock:
            self._refresh()

    def _move_aside(self, path: Path, why: str) -> None:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        os.replace(path, aside)
        log.error(
            "checkpoint is corrupt and was moved aside; rebuilding from the hardware and the API server "
            "path=%s moved_to=%s reason=%s",
            path,
            aside,
            why,
        )

    # --- records ------------------------------------------------------------------------------------------

    def get(self, uid: str) -> ClaimRecord | None:
        with self._lock:
            self._refresh()
            raw = self._claims.get(uid)
            return ClaimRecord.from_json(uid, json.loads(raw)) if raw is not None else None

    def records(self) -> list[ClaimRecord]:
        with self._lock:
            self._refresh()
            return [ClaimRecord.from_json(uid, json.loads(raw)) for uid, raw in self._claims.items()]

    def put(self, record: ClaimRecord) -> None:
        """Store ``record`` (replacing the claim's earlier one) and write the file before returning."""
        with self._lock:
            self._refresh()
            self._write_through(record.uid, _canonical(record.to_json()))

    def insert_checked(
        self, record: ClaimRecord, check: Callable[[list[ClaimRecord]], None], *, durable: bool = True
    ) -> None:
        """Call ``check(other records)`` and store ``record`` under one lock, so two claims racing for a
        device cannot both pass the check. ``check`` raises to refuse, and must not change the records it is
        given (they are cached views). ``durable`` False keeps it in memory
        until the next write (for a claim whose every change start-up finds and undoes without a record)."""
        with self._lock:
            self._refresh()
            others = [self._view(uid, raw) for uid, raw in self._claims.items() if uid != record.uid]
            check(others)
            if durable:
                self._write_through(record.uid, _canonical(record.to_json()))
            else:
                self._claims[record.uid] = _canonical(record.to_json())
                self._unwritten.add(record.uid)

    def _view(self, uid: str, raw: str) -> ClaimRecord:
        view = self._parsed.get((uid, raw))
        if view is None:
            if len(self._parsed) > 4 * len(self._claims) + 64:
                self._parsed = {}  # drop views of texts replaced since
            view = self._parsed[uid, raw] = ClaimRecord.from_json(uid, json.loads(raw))
        return view

    def remove(self, uid: str) -> None:
        with self._lock:
            self._refresh()
            if uid in self._unwritten:
                # Never in the file, so forgetting it needs no write (one that a full disk would refuse).
                self._unwritten.discard(uid)
                del self._claims[uid]
            elif uid in self._claims:
                self._write_through(uid, None)

    def _write_through(self, uid: str, text: str | None) -> None:
        """Set (or with None, drop) one claim and write the file; if the write fails, memory keeps what the
        file has, so a failed write never leaves the two disagreeing."""
        before = self._claims.get(uid)
        if text is None:
            del self._claims[uid]
        else:
            self._claims[uid] = text
        try:
            self._save()
        except DeviceError:
            if before is None:
                self._claims.pop(uid, None)
            else:
                self._claims[uid] = before
            raise

    # --- the file -----------------------------------------------------------------------------------------

    def _save(self) -> None:
        path = self.path
        if path is None:
            return
        # The canonical text of ``data`` (what the checksum covers), assembled from the claims' cached texts.
        claims = "{" + ",".join(f"{_canonical(uid)}:{self._claims[uid]}" for uid in sorted(self._claims)) + "}"
        top = {**self._extra, "bootId": self.boot_id, "claims": None}
        data = (
            "{"
            + ",".join(f"{_canonical(k)}:{claims if k == 'claims' else _canonical(top[k])}" for k in sorted(top))
            + "}"
        )
        digest = "sha256:" + hashlib.sha256(data.encode()).hexdigest()
        text = (
            f'{{"checksum":{_canonical(digest)},"data":{data},"kind":{_canonical(KIND)},'
            f'"version":"{MAJOR_VERSION}.{MINOR_VERSION}"}}\n'
        )
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            tmp = None
            self._unwritten.clear()
            self._stamp = _file_stamp(path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself must survive a power loss
            finally:
                os.close(dir_fd)
        except OSError as err:
            raise DeviceError(f"cannot write checkpoint {path}: {err}; {storage_fix(err, '--state-dir')}") from err
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def read_records(path: Path) -> list[ClaimRecord]:
    """The claims of a checkpoint file, read without locking or changing it (for display); none when there is
    no file. Raises ``CorruptCheckpoint`` (or ``OSError``) when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise CorruptCheckpoint(f"not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("kind") != KIND or _version(doc.get("version"))[0] != MAJOR_VERSION:
        raise CorruptCheckpoint(f"not a checkpoint of format {MAJOR_VERSION}.x")
    data = doc.get("data")
    claims = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(claims, dict):
        raise CorruptCheckpoint("no claims")
    return [ClaimRecord.from_json(uid, raw) for uid, raw in claims.items()]


def _version(raw: Any) -> tuple[int, int]:
    if not isinstance(raw, str):
        raise CorruptCheckpoint(f"version {raw!r} is not a 'MAJOR.MINOR' string")
    major, _, minor = raw.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError as err:
        raise CorruptCheckpoint(f"version {raw!r} is not a 'MAJOR.MINOR' string") from err
