"""Typed GPU errors: every NVML failure becomes one of these, naming the device and the call."""

from __future__ import annotations

from dradriver.errors import DeviceError


class GpuError(DeviceError):
    """A GPU-layer operation failed. ``code`` is the NVML return code when NVML reported it."""

    code: int | None = None

    def __init__(self, message: str, *, device: str | None = None, call: str | None = None) -> None:
        self.device = device
        self.call = call
        where = " ".join(part for part in (f"{call}" if call else "", f"on {device}" if device else "") if part)
        super().__init__(f"{where}: {message}" if where else message)


class Uninitialized(GpuError):
    code = 1


class InvalidArgument(GpuError):
    code = 2


class NotSupported(GpuError):
    code = 3


class NoPermission(GpuError):
    code = 4


class NotFound(GpuError):
    code = 6


class DriverNotLoaded(GpuError):
    code = 9


class Timeout(GpuError):
    code = 10


class LibraryNotFound(GpuError):
    code = 12


class GpuIsLost(GpuError):
    code = 15


class ResetRequired(GpuError):
    code = 16


class InUse(GpuError):
    code = 19


class InsufficientResources(GpuError):
    code = 23


class UnknownNvmlError(GpuError):
    code = 999


class NvmlReleased(GpuError):
    """This process's NVML is not running for now: it was let go for a GPU leaving the ``nvidia`` driver and is not
    started again while that unbind is still in the kernel (or starting it failed). Retryable: the next call after
    the unbind has returned starts it again."""


class SessionEnded(NvmlReleased):
    """A handle from an NVML session that ended (NVML was let go and started again) in the middle of an operation;
    its handles mean nothing to the new session. Retryable."""


_BY_CODE: dict[int, type[GpuError]] = {
    cls.code: cls
    for cls in (
        Uninitialized,
        InvalidArgument,
        NotSupported,
        NoPermission,
        NotFound,
        DriverNotLoaded,
        Timeout,
        LibraryNotFound,
        GpuIsLost,
        ResetRequired,
        InUse,
        InsufficientResources,
        UnknownNvmlError,
    )
    if cls.code is not None
}

# What a user can do about the codes that have a remedy; appended to the message.
_HINTS: dict[int, str] = {
    4: "run the driver as root (the DaemonSet must be privileged)",
    9: "load the NVIDIA kernel module (is the NVIDIA driver installed on this node?)",
    12: "install the NVIDIA driver or use --gpu-backend sim",
    15: "the GPU fell off the bus; drain the node and reset or reboot it",
    16: "reset the GPU (nvidia-smi -r) or reboot the node to apply the pending change",
    # NVML_ERROR_LIB_RM_VERSION_MISMATCH: the user-space driver and the kernel module differ (an in-place upgrade).
    18: "the NVIDIA driver was upgraded in place: reload its kernel module or reboot the node, then restart this "
    "pod, which loads the new NVML and rediscovers the driver's files",
}


def error_for_code(code: int, text: str, *, device: str | None = None, call: str | None = None) -> GpuError:
    """The typed error for NVML return ``code`` with NVML's own ``text`` and, where one exists, a fix."""
    cls = _BY_CODE.get(code, GpuError)
    hint = _HINTS.get(code)
    err = cls(f"{text} ({hint})" if hint else text, device=device, call=call)
    if cls is GpuError:
        err.code = code
    return err
