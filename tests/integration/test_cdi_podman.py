"""Our CDI specs in a real CDI consumer: podman injects the devices and environment of a prepared claim.

Needs root, podman, runc, busybox and unshare (`.ci/run` installs them where apt-get works); skipped otherwise,
saying what is missing. podman reads specs only from /etc/cdi and /var/run/cdi, so each run happens in a private
mount namespace where /run/cdi is the driver's CDI directory (see shared tooling notes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.nodes import inventory_of

from dradriver.driver.cdi import CdiWriter
from dradriver.driver.state import GpuDriver
from dradriver.gpu.fakelib import simulated_gpulib
from dradriver.gpu.inventory import MigMode, discover
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef

DRIVER = "gpu.dradriver.dev"
TOOLS = ("podman", "runc", "busybox", "unshare")
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
"""


def _missing() -> list[str]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


pytestmark = pytest.mark.skipif(
    bool(_missing()),
    reason=f"a real CDI consumer needs {', '.join(_missing())} (podman, runc and busybox-static from apt, run as root)",
)


@pytest.fixture
def world() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dra-cdi-", dir="/tmp"))
    for folder in ("cdi", "empty", "rootfs/bin", "store", "run", "tmp"):
        (root / folder).mkdir(parents=True)
    shutil.copy(str(shutil.which("busybox")), root / "rootfs/bin/busybox")
    for applet in ("sh", "env", "ls", "cat"):
        (root / "rootfs/bin" / applet).symlink_to("busybox")
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    probe = podman_run(root, [], "true")
    if probe.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"podman cannot run a plain container on this machine: {probe.stderr.strip()[-300:]}")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def podman_run(root: Path, cdi_ids: list[str], script: str) -> subprocess.CompletedProcess[str]:
    devices = " ".join(f"--device {cdi_id}" for cdi_id in cdi_ids)
    inner = (
        f"mount --make-rprivate / && mount -t tmpfs t /run && mkdir -p /run/cdi && "
        f"mount --bind {root}/cdi /run/cdi && "
        f"if [ -d /etc/cdi ]; then mount --bind {root}/empty /etc/cdi; fi && "
        f"exec podman --root {root}/store --runroot {root}/run --tmpdir {root}/tmp --events-backend none "
        f"--cgroup-manager cgroupfs run --rm --network=none {devices} --rootfs {root}/rootfs "
        f"/bin/sh -c '{script}'"
    )
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CONTAINERS_CONF": str(root / "containers.conf")},
        check=False,
    )


def claim(uid: str, *devices: str) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef("default", uid, uid),
        devices=tuple(AllocatedDevice(request=f"r{i}", pool="node-a", device=d) for i, d in enumerate(devices)),
    )


def test_podman_injects_a_prepared_gpu_and_mig_device_and_refuses_them_after_unprepare(world: Path) -> None:
    driver = GpuDriver(
        driver_name=DRIVER,
        pool="node-a",
        inventory=inventory_of("mixed"),
        mig_mode=MigMode.STATIC,
        cdi=CdiWriter(world / "cdi", host_path=lambda _path: "/dev/null"),
    )
    uid = "5e0c1a2b-claim"
    prepared = driver.prepare_resource_claims([claim(uid, "gpu-0000-0f-00-0", "gpu-0000-07-00-0-mig-3g20gb-0")])
    result = prepared[uid]
    assert result.error is None
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]

    done = podman_run(
        world,
        cdi_ids,
        "echo NVD=$NVIDIA_VISIBLE_DEVICES; ls /dev/nvidia1 /dev/nvidia0 "
        "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-caps",
    )
    assert done.returncode == 0, done.stderr
    assert "NVD=GPU-" in done.stdout and "MIG-" in done.stdout
    assert "/dev/nvidia1" in done.stdout and "/dev/nvidiactl" in done.stdout
    assert "nvidia-cap" in done.stdout  # the MIG device's capability nodes

    driver.unprepare_resource_claims([ClaimRef("default", uid, uid)])
    gone = podman_run(world, cdi_ids[:1], "true")
    assert gone.returncode != 0
    assert "unresolvable CDI devices" in gone.stderr


def test_podman_sees_a_carved_mig_devices_uuid_and_capability_nodes(world: Path) -> None:
    gpulib, node = simulated_gpulib("hgx-h100-80gb", node_name="node-a")
    driver = GpuDriver(
        driver_name=DRIVER,
        pool="node-a",
        inventory=discover(gpulib),
        mig_mode=MigMode.DYNAMIC,
        cdi=CdiWriter(world / "cdi", host_path=lambda _path: "/dev/null"),
        gpulib=gpulib,
    )
    uid = "7a1d-mig-claim"
    result = driver.prepare_resource_claims([claim(uid, "gpu-0000-1b-00-0-mig-2g20gb-4")])[uid]
    assert result.error is None
    [record] = driver.checkpoint.records()
    mig_uuid = record.devices[0].mig_uuid
    assert mig_uuid is not None and mig_uuid.startswith("MIG-")
    caps = [
        c.path for c in gpulib.mig_device(node.gpus[0].uuid, record.devices[0].gpu_instance_id or 0, 0).capability_nodes
    ]
    done = podman_run(
        world, list(result.devices[0].cdi_device_ids), f"echo NVD=$NVIDIA_VISIBLE_DEVICES; ls {' '.join(caps)}"
    )
    assert done.returncode == 0, done.stderr
    assert f"NVD={mig_uuid}" in done.stdout
    assert all(path in done.stdout for path in caps) and len(caps) == 2
    driver.unprepare_resource_claims([ClaimRef("default", uid, uid)])
    assert node.gpus[0].gpu_instances == {}
    gpulib.close()
