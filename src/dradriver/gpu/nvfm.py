"""``NvfmFabricManager``: the Fabric Manager port on a real node, through FM's client library ``libnvfm`` (ctypes).

Fabric Manager (FM) runs as a daemon (``nv-fabricmanager``); a client loads ``libnvfm.so.1`` (FM's SDK package),
calls ``fmLibInit`` once, then ``fmConnect`` to FM's unix socket or TCP address for a handle that the partition
calls take, and ``fmDisconnect``. As NVIDIA's DRA driver does, every operation opens a connection of its own and
closes it, so an FM restarted between two prepares costs nothing. The structures, their version words
(``sizeof(struct) | version << 24``), the array bounds and the return codes are those of FM's headers
(``nv_fm_types.h``, ``nv_fm_agent.h``); a count past an array's bound fails loudly, because a clamped list could
match a claim to part of a partition.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from dradriver.gpu.fabric_manager import (
    UNKNOWN_PCI_BUS_ID,
    FabricManagerError,
    FabricManagerNotReady,
    FabricPartition,
    PartitionGpu,
    normalize_pci_bus_id,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The files a client loads, newest soname first (the SDK's development package adds the plain name).
LIBRARY_NAMES = ("libnvfm.so.1", "libnvfm.so")
#: FM's unix socket under the driver's root, where NVIDIA's DRA driver looks for it by default.
DEFAULT_SOCKET = "run/nvidia-fabricmanager/socket"
#: The port of a TCP address given without one (``FM_CMD_PORT_NUMBER``).
DEFAULT_PORT = 6666
#: How long fmConnect waits for FM (go-nvfm's default, which NVIDIA's driver keeps).
DEFAULT_TIMEOUT_MS = 1000

MAX_STR_LENGTH = 256  # FM_MAX_STR_LENGTH
UUID_BUFFER_SIZE = 80  # FM_UUID_BUFFER_SIZE
PCI_BUS_ID_BUFFER_SIZE = 32  # FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE
MAX_GPUS = 16  # FM_MAX_NUM_GPUS: the GPUs one partition's array holds
MAX_PARTITIONS = 64  # FM_MAX_FABRIC_PARTITIONS: the partitions the list's array holds
_ADDR_TYPE_INET = 1  # NV_FM_API_ADDR_TYPE_INET
_ADDR_TYPE_UNIX = 2  # NV_FM_API_ADDR_TYPE_UNIX

#: fmReturn_t, by code.
RETURN_NAMES = {
    0: "FM_ST_SUCCESS",
    -1: "FM_ST_BADPARAM",
    -2: "FM_ST_GENERIC_ERROR",
    -3: "FM_ST_NOT_SUPPORTED",
    -4: "FM_ST_UNINITIALIZED",
    -5: "FM_ST_TIMEOUT",
    -6: "FM_ST_VERSION_MISMATCH",
    -7: "FM_ST_IN_USE",
    -8: "FM_ST_NOT_CONFIGURED",
    -9: "FM_ST_CONNECTION_NOT_VALID",
    -10: "FM_ST_NVLINK_ERROR",
    -11: "FM_ST_RESOURCE_BAD",
    -12: "FM_ST_RESOURCE_IN_USE",
    -13: "FM_ST_RESOURCE_NOT_IN_USE",
    -14: "FM_ST_RESOURCE_EXHAUSTED",
    -15: "FM_ST_RESOURCE_NOT_READY",
    -16: "FM_ST_PARTITION_EXISTS",
    -17: "FM_ST_PARTITION_ID_IN_USE",
    -18: "FM_ST_PARTITION_ID_NOT_IN_USE",
    -19: "FM_ST_PARTITION_NAME_IN_USE",
    -20: "FM_ST_PARTITION_NAME_NOT_IN_USE",
    -21: "FM_ST_PARTITION_ID_NAME_MISMATCH",
    -22: "FM_ST_NOT_READY",
    -23: "FM_ST_RESOURCE_USED_IN_THIS_PARTITION",
    -24: "FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION",
    -25: "FM_ST_PARTITION_MISWIRED_TRUNKS",
    -26: "FM_ST_PARTITION_INSUFFICIENT_TRUNKS",
    -27: "FM_ST_PARTITION_MISSING_SWITCHES",
    -28: "FM_ST_PARTITION_NETWORK_CONFIG_ERROR",
    -29: "FM_ST_PARTITION_ROUTE_PROGRAMMING_ERROR",
}
_SUCCESS = 0

#: What a return code means for the call that got it, as FM's headers document it, and what to do.
_MEANINGS = {
    ("fmConnect", -9): "Fabric Manager is not reachable there: start it (systemctl start nvidia-fabricmanager on the "
    "host, or where the driver's container runs it) or give where it listens with --fabric-manager-address",
    ("fmConnect", -6): "the installed libnvfm does not take this client's fmConnectParams_v2: install FM's SDK "
    "package of the driver's branch",
    ("fmGetSupportedFabricPartitions", -6): "the installed libnvfm does not take this client's "
    "fmFabricPartitionList_v2: install FM's SDK package of the driver's branch",
    ("fmActivateFabricPartition", -1): "Fabric Manager supports no such partition",
    ("fmActivateFabricPartition", -7): "Fabric Manager reports the partition already active",
    ("fmDeactivateFabricPartition", -1): "Fabric Manager supports no such partition",
    ("fmDeactivateFabricPartition", -4): "the partition is not active",
}
_GENERAL_MEANINGS = {
    -3: "Fabric Manager does not run in shared-NVSwitch mode: set FABRIC_MODE=1 in its fabricmanager.cfg and "
    "restart it (docs/partitions.md)",
    -8: "Fabric Manager is still initialising and has no data yet; a start waits for it (--wait-for-driver)",
    -10: "an NVLink error or training failure; see Fabric Manager's log",
    -12: "one of the resources the call names is already in use",
    -22: "Fabric Manager is not ready to serve API requests yet; a start waits for it (--wait-for-driver)",
    -24: "one of the partition's GPUs is already in another partition",
}
#: The codes that say FM is not there yet or still starting: FM_ST_CONNECTION_NOT_VALID (not reachable),
#: FM_ST_NOT_CONFIGURED (initialising, no data), FM_ST_NOT_READY; raised as FabricManagerNotReady.
NOT_READY_CODES = frozenset({-9, -8, -22})


class _ConnectParams(ctypes.Structure):
    """``fmConnectParams_v2``."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("addressInfo", ctypes.c_char * MAX_STR_LENGTH),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
        ("addressType", ctypes.c_int),  # enum nvFmApiAddrTypes
    ]


class _PartitionGpuInfo(ctypes.Structure):
    """``fmFabricPartitionGpuInfo_t``."""

    _fields_ = [
        ("physicalId", ctypes.c_uint),
        ("uuid", ctypes.c_char * UUID_BUFFER_SIZE),
        ("pciBusId", ctypes.c_char * PCI_BUS_ID_BUFFER_SIZE),
        ("numNvLinksAvailable", ctypes.c_uint),
        ("maxNumNvLinks", ctypes.c_uint),
        ("nvlinkLineRateMBps", ctypes.c_uint),
    ]


class _PartitionInfo(ctypes.Structure):
    """``fmFabricPartitionInfo_t``."""

    _fields_ = [
        ("partitionId", ctypes.c_uint),
        ("isActive", ctypes.c_uint),
        ("numGpus", ctypes.c_uint),
        ("gpuInfo", _PartitionGpuInfo * MAX_GPUS),
    ]


class _PartitionList(ctypes.Structure):
    """``fmFabricPartitionList_v2``."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numPartitions", ctypes.c_uint),
        ("maxNumPartitions", ctypes.c_uint),
        ("partitionInfo", _PartitionInfo * MAX_PARTITIONS),
    ]


def struct_version(struct: type[ctypes.Structure], version: int) -> int:
    """FM's version word of a structure (``MAKE_FM_PARAM_VERSION``): its size, and the version in the top byte."""
    return ctypes.sizeof(struct) | (version << 24)


CONNECT_PARAMS_VERSION = struct_version(_ConnectParams, 2)  # fmConnectParams_version
PARTITION_LIST_VERSION = struct_version(_PartitionList, 1)  # fmFabricPartitionList_version


@dataclass(frozen=True)
class FabricManagerAddress:
    """Where FM's API listens: a unix socket's path, or a TCP address ``<ipv4>[:<port>]`` (port 6666 unless given)."""

    address: str
    unix_socket: bool

    @classmethod
    def parse(cls, text: str) -> FabricManagerAddress:
        """An absolute path is a unix socket, anything else a TCP address; ``FabricManagerError`` for neither."""
        if text.startswith("/"):
            return cls(text, True)
        host, colon, port = text.partition(":")
        if not _is_ipv4(host) or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise FabricManagerError(
                f"Fabric Manager address {text!r} is neither a unix socket's absolute path nor <ipv4>[:<port>]"
            )
        return cls(text, False)

    def __str__(self) -> str:
        return f"unix socket {self.address}" if self.unix_socket else f"{self.address} (TCP)"


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


class _Library:
    """libnvfm loaded once per file (by its real path: a symlink and its target are one library to the loader),
    ``fmLibInit`` called by its first user and ``fmLibShutdown`` by its last: FM refuses a second init in one process
    (``FM_ST_IN_USE``). A shutdown that fails leaves the library initialised: the next user does not init it again,
    and the next last user tries the shutdown again."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _users: ClassVar[dict[str, int]] = {}
    _loaded: ClassVar[dict[str, ctypes.CDLL]] = {}
    _initialised: ClassVar[set[str]] = set()

    @classmethod
    def acquire(cls, path: str) -> ctypes.CDLL:
        key = os.path.realpath(path)
        with cls._lock:
            lib = cls._loaded.get(key) or _load(path)
            cls._loaded[key] = lib
            if key not in cls._initialised:
                _check(lib.fmLibInit(), "fmLibInit", path=path)
                cls._initialised.add(key)
            cls._users[key] = cls._users.get(key, 0) + 1
            return lib

    @classmethod
    def release(cls, path: str) -> None:
        key = os.path.realpath(path)
        with cls._lock:
            cls._users[key] -= 1
            if cls._users[key] == 0:
                code = cls._loaded[key].fmLibShutdown()
                if code == _SUCCESS:
                    cls._initialised.discard(key)
                else:
                    log.warning("fmLibShutdown failed library=%s error=%s", path, RETURN_NAMES.get(code, code))

    @classmethod
    def users(cls, path: str) -> int:
        """How many clients hold the library at ``path`` now."""
        with cls._lock:
            return cls._users.get(os.path.realpath(path), 0)


def _load(path: str) -> ctypes.CDLL:
    """Load libnvfm from ``path`` and declare the functions this client calls."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise FabricManagerError(f"cannot load Fabric Manager's client library {path}: {err}") from None
    handle = ctypes.POINTER(ctypes.c_void_p)
    signatures: dict[str, list[Any]] = {
        "fmLibInit": [],
        "fmLibShutdown": [],
        "fmConnect": [ctypes.POINTER(_ConnectParams), handle],
        "fmDisconnect": [ctypes.c_void_p],
        "fmGetSupportedFabricPartitions": [ctypes.c_void_p, ctypes.POINTER(_PartitionList)],
        "fmActivateFabricPartition": [ctypes.c_void_p, ctypes.c_uint],
        "fmDeactivateFabricPartition": [ctypes.c_void_p, ctypes.c_uint],
    }
    for name, argtypes in signatures.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise FabricManagerError(f"{path} has no {name}: it is not Fabric Manager's client library") from None
        function.argtypes = argtypes
        function.restype = ctypes.c_int  # fmReturn_t
    return lib


def _check(code: int, call: str, *, path: str = "", partition: int | None = None, where: str = "") -> None:
    """Raise ``FabricManagerError`` naming the call, FM's return code and what it means, unless it succeeded;
    ``FabricManagerNotReady`` for the codes of an FM not there yet or still starting (:data:`NOT_READY_CODES`)."""
    if code == _SUCCESS:
        return
    name = RETURN_NAMES.get(code, f"return code {code}")
    meaning = _MEANINGS.get((call, code)) or _GENERAL_MEANINGS.get(code)
    subject = f"{call}({partition})" if partition is not None else call
    place = f" at {where}" if where else (f" (library {path})" if path else "")
    error = FabricManagerNotReady if code in NOT_READY_CODES else FabricManagerError
    raise error(f"{subject}{place}: {name}" + (f": {meaning}" if meaning else ""), code=code)


class NvfmFabricManager:
    """The :class:`~dradriver.gpu.fabric_manager.FabricManager` port on the host's FM, one connection per call.

    Calls are serialised: libnvfm does not say it may be used from several threads at once, and FM programs the
    NVSwitches one request at a time anyway. :meth:`close` ends the library session (``fmLibShutdown``)."""

    def __init__(
        self, library_path: str, *, address: FabricManagerAddress, timeout_ms: int = DEFAULT_TIMEOUT_MS
    ) -> None:
        self.library_path = library_path
        self.address = address
        self.timeout_ms = timeout_ms
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = _Library.acquire(library_path)

    def close(self) -> None:
        """End this client's library session; the last client of the file shuts the library down."""
        with self._lock:
            if self._lib is not None:
                self._lib = None
                _Library.release(self.library_path)

    # --- FM's API ---------------------------------------------------------------------------------------------

    def supported_partitions(self) -> list[FabricPartition]:
        def call(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> list[FabricPartition]:
            listing = _PartitionList(version=PARTITION_LIST_VERSION)
            _check(lib.fmGetSupportedFabricPartitions(handle, ctypes.byref(listing)), "fmGetSupportedFabricPartitions")
            return partitions_of(listing)

        return self._connected(call)

    def activate(self, partition_id: int) -> None:
        def call(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
            code = lib.fmActivateFabricPartition(handle, partition_id)
            _check(code, "fmActivateFabricPartition", partition=partition_id)

        self._connected(call)

    def deactivate(self, partition_id: int) -> None:
        def call(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
            code = lib.fmDeactivateFabricPartition(handle, partition_id)
            _check(code, "fmDeactivateFabricPartition", partition=partition_id)

        self._connected(call)

    # --- one connection per call ------------------------------------------------------------------------------

    def _connected(self, call: Callable[[ctypes.CDLL, ctypes.c_void_p], T]) -> T:
        """Connect to FM, make ``call`` with the handle, disconnect (a failed disconnect is only logged)."""
        with self._lock:
            lib = self._lib
            if lib is None:
                raise FabricManagerError(f"the Fabric Manager client of {self.library_path} is closed")
            self._check_socket()
            handle = ctypes.c_void_p()
            params = self._connect_params()
            _check(lib.fmConnect(ctypes.byref(params), ctypes.byref(handle)), "fmConnect", where=str(self.address))
            try:
                return call(lib, handle)
            finally:
                code = lib.fmDisconnect(handle)
                if code != _SUCCESS:
                    log.warning("fmDisconnect failed address=%s error=%s", self.address, RETURN_NAMES.get(code, code))

    def _connect_params(self) -> _ConnectParams:
        encoded = self.address.address.encode()
        if len(encoded) >= MAX_STR_LENGTH:
            raise FabricManagerError(
                f"Fabric Manager address {self.address.address!r} is longer than FM's {MAX_STR_LENGTH - 1} bytes"
            )
        unix = self.address.unix_socket
        return _ConnectParams(
            version=CONNECT_PARAMS_VERSION,
            addressInfo=encoded,
            timeoutMs=self.timeout_ms,
            addressIsUnixSocket=1 if unix else 0,
            addressType=_ADDR_TYPE_UNIX if unix else _ADDR_TYPE_INET,
        )

    def _check_socket(self) -> None:
        """A unix socket that is not there says more than FM's FM_ST_CONNECTION_NOT_VALID: what to start."""
        if not self.address.unix_socket:
            return
        path = Path(self.address.address)
        try:
            is_socket = stat.S_ISSOCK(path.stat().st_mode)
        except OSError:
            is_socket = False
        if not is_socket:
            raise FabricManagerNotReady(
                f"no Fabric Manager socket at {path}: start Fabric Manager (nvidia-fabricmanager) in shared-NVSwitch "
                "mode (FABRIC_MODE=1) with its API on that socket (FM_CMD_UNIX_DOMAIN_SOCKET=/run/nvidia-fabricmanager/"
                "socket in its fabricmanager.cfg, where NVIDIA's DRA driver looks too), or give where it listens with "
                "--fabric-manager-address (chart value fabricManagerPartitions.address)"
            )


def partitions_of(listing: _PartitionList) -> list[FabricPartition]:
    """FM's partition list in our types, every count checked against its array's bound."""
    count = _bounded(listing.numPartitions, MAX_PARTITIONS, "partitions in its list")
    partitions = []
    for info in listing.partitionInfo[:count]:
        size = _bounded(info.numGpus, MAX_GPUS, f"GPUs in partition {info.partitionId}")
        gpus = tuple(
            PartitionGpu(gpu.physicalId, _pci_bus_id(gpu, info.partitionId), gpu.uuid.decode(errors="replace"))
            for gpu in info.gpuInfo[:size]
        )
        partitions.append(FabricPartition(info.partitionId, info.isActive != 0, gpus))
    return partitions


def _pci_bus_id(gpu: _PartitionGpuInfo, partition_id: int) -> str:
    """The GPU's normalised PCI address, or ``UNKNOWN_PCI_BUS_ID`` (logged) where FM's is empty or unparsable: one
    such GPU must not break every listing (a deactivation needs only ids and states); matching refuses it."""
    text = gpu.pciBusId.decode(errors="replace")
    try:
        return normalize_pci_bus_id(text)
    except FabricManagerError:
        log.warning(
            "Fabric Manager reported a GPU without a parsable PCI address partition=%d module=%d pci_bus_id=%r",
            partition_id,
            gpu.physicalId,
            text,
        )
        return UNKNOWN_PCI_BUS_ID


def _bounded(count: int, bound: int, what: str) -> int:
    if count > bound:
        raise FabricManagerError(
            f"fmGetSupportedFabricPartitions reported {count} {what}, but FM's structure holds at most {bound}: the "
            "installed libnvfm disagrees with the FM API this client was written for (nv_fm_types.h); refused "
            "rather than match claims to part of a partition"
        )
    return count
