"""Applying a claim's resolved config at prepare: the compute-mode, time-slice and MPS steps and their undos.

Steps (each recorded by the claim's :class:`~dradriver.driver.prepare.transaction.Transaction`):

- ``compute-mode``: set a device's compute mode (a GPU, or a MIG device by its UUID). The mode found before the
  first claim changed it is recorded and handed on: a later claim on the same device records the same original,
  and the last claim to leave restores it.
- ``time-slice``: set a whole GPU's time-slice (``nvidia-smi compute-policy``). The last claim to leave resets it
  to Default (0), as NVIDIA's driver does; the previous value cannot be read back.
- ``mps-daemon``: start the claim's MPS control daemon with its limits (one per claim, over all of its MPS
  devices); undo quits it and removes its directories.

What a device needs follows from its config (:func:`wanted_settings`): MPS runs the GPU in ExclusiveProcess (only
the MPS server holds a context), time-slicing in Default; an explicit ``computeMode`` otherwise. Two claims on one
GPU (consumable shares, or a partition and its parent's other partitions for MIG devices) must agree on the
GPU-wide settings: :func:`refuse_conflicts` names the other claim, reading the checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dradriver.driver.prepare.checkpoint import Action, CheckpointStore, ClaimRecord, DeviceRecord
from dradriver.driver.prepare.mps import CONTAINER_LOG_DIR, CONTAINER_PIPE_DIR, ControlUnavailable, MpsControl
from dradriver.driver.prepare.mps_shm import CONTAINER_SHM_DIR
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.errors import ClaimError, DeviceError
from dradriver.gpu.errors import GpuError, NotFound
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.models import ComputeMode
from dradriver.quantity import Quantity

# The config module (pydantic models) is imported where a config is at hand, not here: a driver whose claims
# carry no opaque config never loads pydantic (docs/reliability.md, memory).
if TYPE_CHECKING:
    from dradriver.driver.prepare.config import AnyConfig, MpsConfig

log = logging.getLogger(__name__)

STEP_COMPUTE_MODE = "compute-mode"
STEP_TIME_SLICE = "time-slice"
STEP_MPS_DAEMON = "mps-daemon"

#: Where a device's resolved config is recorded in the checkpoint (a DeviceRecord extra field).
CONFIG_FIELD = "config"
#: Consumable shares (KEP-5075): the device's share IDs in this claim and the capacity they consume.
SHARE_IDS_FIELD = "shareIds"
CONSUMED_FIELD = "consumedCapacity"

_MODES = {
    "Default": ComputeMode.DEFAULT,
    "ExclusiveProcess": ComputeMode.EXCLUSIVE_PROCESS,
    "Prohibited": ComputeMode.PROHIBITED,
}


@dataclass(frozen=True)
class Settings:
    """What a device's config asks of the hardware."""

    compute_mode: str | None  # a computeMode name
    timeslice: str | None  # an interval name (whole GPUs only)
    mps: MpsConfig | None
    strategy: str | None


def wanted_settings(config: Mapping[str, Any] | None, kind: str) -> Settings:
    """The settings of a recorded (already validated) config of a ``gpu`` or ``mig`` device."""
    if not config:
        return Settings(None, None, None, None)
    from dradriver.driver.prepare.config import MpsConfig

    if config.get(SHARED_KEY):
        # Several claims' MPS daemons on one GPU: each server needs the Default mode to get a context at all.
        return Settings("Default", None, MpsConfig.model_validate(config["sharing"].get("mps") or {}), "MPS")
    sharing = config.get("sharing") or {}
    strategy = sharing.get("strategy")
    mode = config.get("computeMode")
    timeslice = None
    mps = None
    if strategy == "MPS":
        mode = "ExclusiveProcess"
        mps = MpsConfig.model_validate(sharing.get("mps") or {})
    elif strategy == "TimeSlicing" and kind == "gpu":
        mode = "Default"
        timeslice = (sharing.get("timeSlicing") or {}).get("interval", "Default")
    return Settings(mode, timeslice, mps, strategy)


#: Marks the recorded config of a consumable share (not part of the API: set by prepare, never by users).
SHARED_KEY = "consumableShare"


def consumed_total(results: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """The capacity the shares of one device consume together (``AllocatedDevice.consumed_capacity`` summed)."""
    totals: dict[str, Quantity] = {}
    for result in results:
        for name, value in result.consumed_capacity:
            totals[name] = totals[name].add(Quantity.parse(value)) if name in totals else Quantity.parse(value)
    return tuple(sorted((name, str(q)) for name, q in totals.items()))


def share_config(
    claim: str,
    device: str,
    config: AnyConfig | None,
    consumed: Sequence[tuple[str, str]],
    shared: bool,
    *,
    shares_mode: str | None = None,
) -> dict[str, Any] | None:
    """The config to record for a device: as resolved, or for a consumable share the MPS limits its consumed
    capacity sets (pinned memory = consumed memory, active threads = consumed shares), capped further by any
    smaller limit the claim's own MPS config gives. With ``--gpu-sharing consumable`` a share is enforced with
    MPS, so TimeSlicing and compute modes are refused on it; with ``--consumable-shares`` (``shares_mode``) the
    claim's config chooses: :func:`_nvidia_share_config`."""
    if not shared:
        return recorded_config(config) if config is not None else None
    if shares_mode is not None:
        return _nvidia_share_config(claim, device, config, consumed, shares_mode)
    from dradriver.driver.prepare.config import API_VERSION

    data: dict[str, Any] = (
        recorded_config(config) if config is not None else {"apiVersion": API_VERSION, "kind": "GpuConfig"}
    )
    sharing = data.get("sharing") or {"strategy": "MPS"}
    if sharing.get("strategy") != "MPS" or data.get("computeMode"):
        raise ClaimError(
            f"claim {claim}: device {device} is a consumable share of a GPU, which is enforced with MPS; its config "
            "may set only sharing.strategy MPS and MPS limits (no TimeSlicing, no computeMode)"
        )
    mps = dict(sharing.get("mps") or {})
    used = dict(consumed)
    if "memory" in used:
        limit = mps.get("defaultPinnedDeviceMemoryLimit")
        if limit is None or Quantity.parse(limit) > Quantity.parse(used["memory"]):
            mps["defaultPinnedDeviceMemoryLimit"] = used["memory"]
    shares = Quantity.parse(used["shares"]).as_integer() if "shares" in used else 0
    if shares > 0:
        percentage = mps.get("defaultActiveThreadPercentage")
        mps["defaultActiveThreadPercentage"] = min(shares, percentage) if percentage is not None else shares
    data["sharing"] = {"strategy": "MPS", "mps": mps}
    data[SHARED_KEY] = True
    return data


def _nvidia_share_config(
    claim: str, device: str, config: AnyConfig | None, consumed: Sequence[tuple[str, str]], shares_mode: str
) -> dict[str, Any] | None:
    """A share of a device published with ``--consumable-shares``: the claim's config picks how it is kept apart
    from the others. None: not at all (as device-plugin time-slicing replicas). TimeSlicing: the GPU-wide
    time-slice, which every sharing claim must ask the same of (:func:`refuse_conflicts`). MPS: the claim's own
    daemon, in the Default compute mode (several servers on one device), its limits what the share consumed:
    pinned memory = consumed memory (when any), active threads = its part of the shares (shares/N)."""
    if config is None or not getattr(config, "sharing", None):
        return recorded_config(config) if config is not None else None
    data = recorded_config(config)
    sharing = data["sharing"]
    if sharing.get("strategy") != "MPS":
        return data
    if data.get("computeMode"):
        raise ClaimError(
            f"claim {claim}: device {device} is a consumable share; MPS on a share runs in the Default compute mode "
            "(one MPS server per claim), so remove computeMode"
        )
    mps = dict(sharing.get("mps") or {})
    used = dict(consumed)
    if "memory" in used and Quantity.parse(used["memory"]).value > 0:
        limit = mps.get("defaultPinnedDeviceMemoryLimit")
        if limit is None or Quantity.parse(limit) > Quantity.parse(used["memory"]):
            mps["defaultPinnedDeviceMemoryLimit"] = used["memory"]
    if shares_mode.isdigit() and "shares" in used:
        part = max(1, Quantity.parse(used["shares"]).as_integer() * 100 // int(shares_mode))
        percentage = mps.get("defaultActiveThreadPercentage")
        mps["defaultActiveThreadPercentage"] = min(part, percentage) if percentage is not None else part
    data["sharing"] = {"strategy": "MPS", "mps": mps}
    data[SHARED_KEY] = True
    return data


def recorded_config(config: AnyConfig) -> dict[str, Any]:
    """A resolved config as the checkpoint keeps it (its JSON form, with defaults filled in)."""
    return config.model_dump(by_alias=True, exclude_none=True)


def sharing_status(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a device's status data reports about its sharing (None: exclusive)."""
    if not config or not config.get("sharing"):
        return None
    sharing = dict(config["sharing"])
    if config.get("computeMode"):
        sharing["computeMode"] = config["computeMode"]
    return sharing


def refuse_conflicts(ref: str, record: ClaimRecord, others: Sequence[ClaimRecord]) -> None:
    """Refuse GPU-wide settings that differ from those of another claim already prepared on the same GPU."""
    for mine in record.devices:
        wanted = wanted_settings(mine.extra.get(CONFIG_FIELD), mine.kind)
        if wanted.compute_mode is None and wanted.timeslice is None:
            continue
        for other in others:
            for theirs in other.devices:
                if theirs.gpu != mine.gpu or (mine.kind == "mig" and theirs.name != mine.name):
                    continue
                held = wanted_settings(theirs.extra.get(CONFIG_FIELD), theirs.kind)
                for what, a, b in (
                    ("compute mode", wanted.compute_mode, held.compute_mode),
                    ("time-slice", wanted.timeslice, held.timeslice),
                ):
                    if a is not None and b is not None and a != b:
                        raise ClaimError(
                            f"claim {ref}: device {mine.name} needs {what} {a}, but claim {other.uid} "
                            f"({other.namespace}/{other.name}) already prepared on GPU {mine.gpu} runs it with {b}; "
                            "claims sharing a GPU must ask for the same settings (the claim is retried after that "
                            "claim is unprepared)"
                        )


class SharingSteps:
    """The sharing steps on one node. The caller holds the GPU's lock around the compute-mode and time-slice
    steps; ``checkpoint`` tells which other claims still hold a setting when one is undone."""

    def __init__(self, gpulib: GpuLib | None, checkpoint: CheckpointStore, mps: MpsControl | None) -> None:
        self.gpulib = gpulib
        self.checkpoint = checkpoint
        self.mps = mps

    def kinds(self) -> list[StepKind]:
        """The sharing step kinds: their changes are below, their undos and drift checks further down."""
        return [
            StepKind(STEP_COMPUTE_MODE, self.undo_compute_mode, self.compute_mode_drift),
            StepKind(STEP_TIME_SLICE, self.undo_time_slice),
            StepKind(STEP_MPS_DAEMON, self.undo_mps_daemon, self.mps_daemon_drift),
        ]

    def expect(self, txn: Transaction, targets: Mapping[str, str | None]) -> None:
        """Declare the claim's compute-mode, time-slice and MPS steps before its record is first written, so their
        intents cost no write of their own. Called under the claim's GPU locks. ``targets`` maps each device to
        the UUID its settings go to when that is known now (a whole GPU, a MIG device that exists), else None (a
        partition carved by this prepare): such an intent names no device, and its undo has nothing to restore,
        since the MIG device goes with its instance, which is undone after it."""
        for device in txn.record.devices:
            wanted = wanted_settings(device.extra.get(CONFIG_FIELD), device.kind)
            target = targets.get(device.name)
            if wanted.compute_mode is not None:
                mode = int(_MODES[wanted.compute_mode])
                params: dict[str, Any] = {"mode": mode}
                if target is not None:
                    params.update(deviceUUID=target, previous=self._previous_mode(device, txn.record.uid, target))
                txn.expect(STEP_COMPUTE_MODE, device.name, params)
            if wanted.timeslice is not None:
                from dradriver.driver.prepare.config import TIMESLICE_VALUES

                value = TIMESLICE_VALUES[wanted.timeslice]
                txn.expect(STEP_TIME_SLICE, device.name, {"gpuUUID": device.gpu_uuid, "value": value})
        devices = self._mps_devices(txn.record)
        if devices:
            uuids = [targets.get(d.name) for d, _s in devices]
            known = [u for u in uuids if u is not None]
            # Commands name the devices: with a partition still to carve they are made when it exists.
            params = (
                {"deviceUUIDs": known, "commands": mps_commands(txn.record, devices, known), **_multi_user(devices)}
                if len(known) == len(uuids)
                else {}
            )
            txn.expect(STEP_MPS_DAEMON, "", params)

    def apply_device(self, txn: Transaction, device: DeviceRecord) -> None:
        """The compute-mode and time-slice steps of one device (nothing when its config asks for neither)."""
        wanted = wanted_settings(device.extra.get(CONFIG_FIELD), device.kind)
        if wanted.compute_mode is None and wanted.timeslice is None:
            return
        gpulib = self._gpulib(device)
        target = _target(device)
        if wanted.compute_mode is not None:
            mode = _MODES[wanted.compute_mode]
            declared = txn.intent(STEP_COMPUTE_MODE, device.name) or {}
            previous = (
                declared["previous"]
                if declared.get("deviceUUID") == target and "previous" in declared
                else self._previous_mode(device, txn.record.uid, target)
            )
            params = {"deviceUUID": target, "mode": int(mode), "previous": previous}
            txn.run(STEP_COMPUTE_MODE, device.name, params, lambda p: self._set_mode(gpulib, p["deviceUUID"], mode))
        if wanted.timeslice is not None:
            from dradriver.driver.prepare.config import TIMESLICE_VALUES

            value = TIMESLICE_VALUES[wanted.timeslice]
            params = {"gpuUUID": device.gpu_uuid, "value": value}
            txn.run(STEP_TIME_SLICE, device.name, params, lambda p: self._set_timeslice(gpulib, p["gpuUUID"], value))

    def apply_mps(self, txn: Transaction) -> None:
        """The claim's MPS daemon, for the devices whose config asks for MPS (nothing when none does)."""
        devices = self._mps_devices(txn.record)
        if not devices:
            return
        if self.mps is None:
            raise ClaimError(f"claim {txn.record}: MPS is asked for, but this driver runs no MPS control command")
        uuids = [_target(d) for d, _s in devices]
        commands = mps_commands(txn.record, devices, uuids)
        mps = self.mps
        params: dict[str, Any] = {"deviceUUIDs": uuids, "commands": commands, **_multi_user(devices)}
        txn.run(STEP_MPS_DAEMON, "", params, lambda p: _start_daemon(mps, txn.record.uid, p))

    @staticmethod
    def _mps_devices(record: ClaimRecord) -> list[tuple[DeviceRecord, Settings]]:
        return [
            (d, s) for d in record.devices if (s := wanted_settings(d.extra.get(CONFIG_FIELD), d.kind)).mps is not None
        ]

    def _previous_mode(self, device: DeviceRecord, uid: str, target: str) -> int:
        """The mode to restore when the last claim leaves ``target``: what another claim holding it recorded,
        else what the device runs now."""
        holder = self._holder(uid, STEP_COMPUTE_MODE, target)
        if holder is not None:
            return int(holder.params["previous"])
        try:
            return int(self._gpulib(device).compute_mode(target))
        except GpuError as err:
            raise DeviceError(f"device {device.name}: reading its compute mode: {err}") from err

    def cdi_extras(
        self, record: ClaimRecord, device: DeviceRecord
    ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
        """The env and mounts a device adds for its claim's MPS daemon (none without MPS)."""
        action = next((a for a in record.actions if a.step == STEP_MPS_DAEMON), None)
        wanted = wanted_settings(device.extra.get(CONFIG_FIELD), device.kind)
        if action is None or wanted.mps is None:
            return (), ()
        env = (f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}", f"CUDA_MPS_LOG_DIRECTORY={CONTAINER_LOG_DIR}")
        mounts: tuple[tuple[str, str], ...] = (
            (str(action.params["pipeDir"]), CONTAINER_PIPE_DIR),
            (str(action.params["logDir"]), CONTAINER_LOG_DIR),
        )
        if "shmDir" in action.params:  # absent from daemons started before there was one: they use their own
            mounts += ((str(action.params["shmDir"]), CONTAINER_SHM_DIR),)
        return env, mounts

    def ensure_mps(self, record: ClaimRecord) -> bool:
        """Restart the claim's MPS daemon if it died (same directories and limits); True when it was restarted."""
        action = next((a for a in record.actions if a.step == STEP_MPS_DAEMON and a.done), None)
        if action is None or self.mps is None:
            return False
        try:
            if self.mps.alive(action.params):
                return False
        except ControlUnavailable as err:
            log.error("cannot check the MPS control daemon; leaving it as it is claim=%s error=%s", record.uid, err)
            return False
        log.warning(
            "MPS control daemon of claim=%s is gone (pid %s); restarting it", record.uid, action.params.get("pid")
        )
        # Not answering is not always dead: a daemon whose directories were removed runs on unreachable.
        self.mps.kill(action.params)
        action.params.update(_start_daemon(self.mps, record.uid, action.params, restart=True))
        self.checkpoint.put(record)
        return True

    # --- undo ---------------------------------------------------------------------------------------------

    def undo_compute_mode(self, record: ClaimRecord, action: Action) -> None:
        if "deviceUUID" not in action.params:
            return  # declared for a partition not carved yet: its MIG device, if any, goes with its instance
        target = str(action.params["deviceUUID"])
        if self._holder(record.uid, STEP_COMPUTE_MODE, target) is not None:
            return  # another claim still runs the device in this mode; the last one restores it
        gpulib = self._gpulib(None)
        try:
            gpulib.set_compute_mode(target, ComputeMode(int(action.params["previous"])))
        except GpuError as err:
            if _gone(err):
                return  # the MIG device is gone with its claim: nothing to restore
            raise DeviceError(f"restoring the compute mode of {target}: {err}") from err

    def undo_time_slice(self, record: ClaimRecord, action: Action) -> None:
        gpu = str(action.params["gpuUUID"])
        if self._holder(record.uid, STEP_TIME_SLICE, gpu) is not None:
            return
        from dradriver.driver.prepare.config import TIMESLICE_VALUES

        try:
            self._gpulib(None).set_timeslice(gpu, TIMESLICE_VALUES["Default"])
        except GpuError as err:
            raise DeviceError(f"resetting the time-slice of {gpu}: {err}") from err

    def undo_mps_daemon(self, record: ClaimRecord, action: Action) -> None:
        if self.mps is None:
            raise DeviceError("an MPS daemon is recorded, but this driver runs no MPS control command")
        # An intent without its result (a crash right after the start) still names the daemon: its directories
        # follow from the claim, and quitting goes through them. They win over what the record says, so a damaged
        # record can never point the quit (and the removal) at another claim's directories.
        pipe, logs = self.mps.dirs(record.uid)
        self.mps.stop({**action.params, "pipeDir": str(pipe), "logDir": str(logs)})

    # --- drift ------------------------------------------------------------------------------------------------

    def compute_mode_drift(self, record: ClaimRecord, action: Action) -> str | None:
        """A compute mode the claim set that the device no longer runs (or the MIG device it was set on, gone)."""
        if self.gpulib is None:
            return None
        target = str(action.params["deviceUUID"])
        try:
            mode = int(self.gpulib.compute_mode(target))
        except NotFound:
            return f"MIG device {target}, whose compute mode the claim set, is gone"  # with its instance
        return None if mode == int(action.params["mode"]) else f"compute mode of {target} changed to {mode}"

    def mps_daemon_drift(self, record: ClaimRecord, action: Action) -> str | None:
        """The claim's MPS daemon directories, gone. A daemon that died by itself keeps them, and is restarted
        rather than taken as undone."""
        if self.mps is None:
            return None
        base = self.mps.dirs(record.uid)[0].parent
        return None if base.is_dir() else f"MPS daemon directories {base} missing"

    # --- helpers ------------------------------------------------------------------------------------------

    def _holder(self, uid: str, step: str, target: str) -> Action | None:
        """Another claim's recorded action of ``step`` on ``target`` (a device UUID), if any."""
        key = "deviceUUID" if step == STEP_COMPUTE_MODE else "gpuUUID"
        for other in self.checkpoint.records():
            if other.uid == uid:
                continue
            for action in other.actions:
                if action.step == step and action.params.get(key) == target:
                    return action
        return None

    def _gpulib(self, device: DeviceRecord | None) -> GpuLib:
        if self.gpulib is None:
            what = f"device {device.name}'s config" if device is not None else "a recorded setting"
            raise DeviceError(f"{what} needs GPU access (compute mode, time-slice), but this driver has none")
        return self.gpulib

    @staticmethod
    def _set_mode(gpulib: GpuLib, target: str, mode: ComputeMode) -> dict[str, Any]:
        try:
            gpulib.set_compute_mode(target, mode)
        except GpuError as err:
            raise DeviceError(f"setting compute mode {mode.name}: {err}") from err
        return {}

    @staticmethod
    def _set_timeslice(gpulib: GpuLib, gpu: str, value: int) -> dict[str, Any]:
        try:
            gpulib.set_timeslice(gpu, value)
        except GpuError as err:
            raise DeviceError(f"setting the time-slice: {err}") from err
        return {}


def check_mps_settings(record: ClaimRecord) -> None:
    """Refuse, before the claim's first change, MPS settings its one daemon cannot apply: different thread
    percentages, or a per-device limit naming no device (decided here when every MPS device is a whole GPU, whose
    UUID is known before anything is carved; a MIG device's UUID exists only once it is, so :func:`mps_commands`
    checks those keys at the MPS step)."""
    devices = [
        (d, s) for d in record.devices if (s := wanted_settings(d.extra.get(CONFIG_FIELD), d.kind)).mps is not None
    ]
    if any(d.kind == "mig" for d, _s in devices):
        _one_percentage(record, devices)
    elif devices:
        mps_commands(record, devices, [d.gpu_uuid for d, _s in devices])


def _one_percentage(record: ClaimRecord, devices: Sequence[tuple[DeviceRecord, Settings]]) -> set[int | None]:
    percentages = {s.mps.default_active_thread_percentage for _d, s in devices if s.mps is not None}
    percentages.discard(None)
    if len(percentages) > 1:
        raise ClaimError(
            f"claim {record}: its devices ask for different defaultActiveThreadPercentage values "
            f"({', '.join(str(p) for p in sorted(p for p in percentages if p is not None))}); one MPS daemon serves "
            "the claim, so give them one value"
        )
    return percentages


def mps_commands(
    record: ClaimRecord, devices: Sequence[tuple[DeviceRecord, Settings]], uuids: Sequence[str]
) -> list[str]:
    """The control commands that apply the claim's MPS limits (NVIDIA's: limits in whole MiB, ``<n>M``)."""
    percentages = _one_percentage(record, devices)
    commands = [f"set_default_active_thread_percentage {p}" for p in percentages]
    for index, ((_device, settings), uuid) in enumerate(zip(devices, uuids, strict=True)):
        mps = settings.mps
        assert mps is not None
        limit = mps.default_pinned_device_memory_limit
        per_device = mps.default_per_device_pinned_memory_limit or {}
        for key, value in per_device.items():
            if key not in uuids and not (key.isdigit() and int(key) < len(uuids)):
                raise ClaimError(
                    f"claim {record}: defaultPerDevicePinnedMemoryLimit names {key!r}, which is neither the UUID of "
                    f"one of the claim's MPS devices ({', '.join(uuids)}) nor an index below {len(uuids)}"
                )
            if key in (uuid, str(index)):
                limit = value
        if limit is not None:
            from dradriver.driver.prepare.config import mib

            commands.append(f"set_default_device_pinned_mem_limit {uuid} {mib(limit)}M")
    return commands


def _multi_user(devices: Sequence[tuple[DeviceRecord, Settings]]) -> dict[str, Any]:
    """``multiUser`` for the claim's one daemon: on when any of its devices asks (a multi-user daemon serves the
    claim's own user as well); left out of the params when off, so records written before it read the same."""
    return {"multiUser": True} if any(s.mps is not None and s.mps.multi_user for _d, s in devices) else {}


def _start_daemon(
    mps: MpsControl, claim_uid: str, params: Mapping[str, Any], *, restart: bool = False
) -> dict[str, Any]:
    return mps.start(
        claim_uid,
        params["deviceUUIDs"],
        params["commands"],
        multi_user=bool(params.get("multiUser", False)),
        restart=restart,
    )


def _target(device: DeviceRecord) -> str:
    """The UUID a device's settings go to: its MIG device for a partition, else its GPU."""
    return device.mig_uuid if device.kind == "mig" and device.mig_uuid else device.gpu_uuid


def _gone(err: GpuError) -> bool:
    return isinstance(err, NotFound)
