"""The root of every error dradriver raises on purpose.

Each layer defines its own subclasses (``gpu.errors``, ``driver``, ``plugin``, ``cel``, ``allocator``).
Messages name the object, the field and the fix, because they reach users unchanged.
"""


class DradriverError(Exception):
    """Base class: an error whose message is fit to show a user as it is."""


class ConfigError(DradriverError):
    """Invalid user input: flags, profile files, opaque configs, YAML documents."""


class ClaimError(DradriverError):
    """A ResourceClaim cannot be handled as given (not allocated, wrong node, bad config)."""


class DeviceError(DradriverError):
    """A device operation failed (NVML, MIG, compute mode, CDI)."""
