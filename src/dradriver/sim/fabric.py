"""The fabric side of a simulated multi-node NVLink node: the ``/proc`` files the ComputeDomain driver reads.

``proc/devices`` lists the character devices with the majors a GB200 host shows for NVIDIA's capability devices
(the numbers are dynamic on real hosts, which is why the driver reads them); the fabric-imex-mgmt capability file
has the fields the kernel driver writes.
"""

from __future__ import annotations

from pathlib import Path

CAPS_MAJOR = 236
IMEX_CHANNELS_MAJOR = 237
IMEX_MGMT_MINOR = 1


def write_fake_proc(root: Path) -> Path:
    """Write ``devices`` and ``driver/nvidia/capabilities/fabric-imex-mgmt`` under ``root``; return ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "devices").write_text(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n195 nvidia-frontend\n"
        f"{CAPS_MAJOR} nvidia-caps\n{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n"
        "510 nvidia-uvm\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
    )
    capability = root / "driver" / "nvidia" / "capabilities" / "fabric-imex-mgmt"
    capability.parent.mkdir(parents=True, exist_ok=True)
    capability.write_text(f"DeviceFileMinor: {IMEX_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    return root
