"""Our CDI specs in a real CDI consumer: podman injects the devices, driver files and environment of a prepared
claim on a simulated node with its stub driver root, the way a CUDA container would get them.

Needs root, podman, runc, busybox and unshare (`.ci/run` installs them where apt-get works); skipped otherwise,
saying what is missing, or failed where the suite demands them (support/required.py). podman reads specs only
from /etc/cdi and /var/run/cdi, so each run happens in a private mount namespace where /run/cdi is the driver's
CDI directory (see shared tooling notes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import required
from support.nodes import inventory_of
from support.short_dirs import short_dir

from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter, device_env_name
from dradriver.nvidia_install.driver_root import discover_driver_root
from dradriver.plugin.handler import AllocatedClaim, ClaimRef
from dradriver.plugin.kubeletplugin.claims import ClaimLocks, allocated_claim
from dradriver.plugin.kubeletplugin.device_metadata import DeviceMetadataWriter
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor
from dradriver.sim import mps_standin
from dradriver.sim.driver_root import write_stub_driver_root
from dradriver.sim.fakelib import simulated_gpulib

DRIVER = "gpu.dradriver.dev"
INVENTORY = inventory_of("mixed")
VERSION = INVENTORY.driver_version
LIBDIR = f"/usr/lib/{os.uname().machine}-linux-gnu"
GPU_A = "gpu-0000-0f-00-0"  # /dev/nvidia1
GPU_B = "gpu-0000-47-00-0"  # /dev/nvidia2
MIG = "gpu-0000-07-00-0-mig-3g20gb-0"  # /dev/nvidia0 + two capability nodes
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


@pytest.fixture
def world() -> Iterator[Path]:
    required.need_tools(_missing(), "a real CDI consumer runs our specs",
                        "apt-get install podman runc busybox-static and run as root (`scripts/test` does)")  # fmt: skip
    with short_dir("dra-cdi-") as root:
        for folder in ("cdi", "empty", "rootfs/bin", "store", "run", "tmp"):
            (root / folder).mkdir(parents=True)
        shutil.copy(str(shutil.which("busybox")), root / "rootfs/bin/busybox")
        for applet in ("sh", "env", "ls", "cat", "echo", "grep", "sort"):
            (root / "rootfs/bin" / applet).symlink_to("busybox")
        (root / "containers.conf").write_text(CONTAINERS_CONF)
        probe = podman_run(root, [], "true")
        if probe.returncode != 0:
            required.need("a podman that runs containers", probe.stderr.strip()[-300:],
                          "podman with runc, as root (see the module docstring)")  # fmt: skip
        yield root


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


def claim(uid: str, *results: tuple[str, str]) -> dict:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}
                        for request, device in results
                    ]
                }
            }
        },
    }


def typed(spec_claim: dict) -> AllocatedClaim:
    """The claim as the plugin layer hands it to the driver."""
    meta = spec_claim["metadata"]
    return allocated_claim(spec_claim, ClaimRef(meta["namespace"], meta["name"], meta["uid"]), DRIVER)


# A stand-in for NVIDIA's nvidia-cdi-hook: it logs its arguments and does what create-symlinks does, in the
# container's root file system found from the OCI state on stdin (runc runs createContainer hooks on the host).
HOOK = """#!{python}
import json, os, sys
with open("{log}", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
state = json.load(sys.stdin)
with open(os.path.join(state["bundle"], "config.json")) as config:
    root = json.load(config)["root"]["path"]
root = os.path.join(state["bundle"], root)
if sys.argv[1] == "create-symlinks":
    for target, link in (a.split("::") for a in sys.argv[2:] if a != "--link"):
        path = os.path.join(root, link.lstrip("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            os.symlink(target, path)
"""


def gpu_driver(world: Path, *, hook: bool = False) -> GpuDriver:
    root = write_stub_driver_root(world / "driver-root", VERSION)
    if hook:
        (root / "usr/bin/nvidia-cdi-hook").write_text(HOOK.format(python=sys.executable, log=world / "hook.log"))
        (root / "usr/bin/nvidia-cdi-hook").chmod(0o755)
    return GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=INVENTORY,
        cdi=CdiWriter(
            world / "cdi",
            host_path=lambda _path: "/dev/null",
            driver_root=discover_driver_root(host_root=str(root), version=VERSION),
        ),
    )


def cdi_ids_by_request(driver: GpuDriver, spec_claim: dict) -> dict[str, list[str]]:
    result = driver.prepare_resource_claims([typed(spec_claim)])[spec_claim["metadata"]["uid"]]
    assert result.error is None
    ids: dict[str, list[str]] = {}
    for device in result.devices:
        for request in device.requests:
            ids.setdefault(request, []).extend(device.cdi_device_ids)
    return ids


def test_a_cuda_container_gets_the_driver_files_device_nodes_and_its_devices_env(world: Path) -> None:
    driver = gpu_driver(world)
    uid = "5e0c1a2b-claim"
    ids = cdi_ids_by_request(driver, claim(uid, ("gpu", GPU_A), ("mig", MIG)))

    done = podman_run(
        world,
        ids["gpu"] + ids["mig"],
        f"echo NVD=$NVIDIA_VISIBLE_DEVICES; env | grep DRADRIVER_DEVICE_ | sort; "
        f"cat {LIBDIR}/libcuda.so.{VERSION} {LIBDIR}/libcuda.so.1 {LIBDIR}/libnvidia-ml.so.1; nvidia-smi; "
        f"ls /lib/firmware/nvidia/{VERSION}; ls /dev/nvidia1 /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm "
        "/dev/nvidia-caps",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "NVD=void" in out  # a legacy-mode nvidia-container-runtime adds no GPUs of its own
    assert "DRADRIVER_DEVICE_GPU_0000_0F_00_0=GPU-" in out
    assert "DRADRIVER_DEVICE_GPU_0000_07_00_0_MIG_3G20GB_0=MIG-" in out
    assert f"stub libcuda.so.{VERSION}" in out  # the versioned library, and the soname link as a file
    assert out.count(f"stub libcuda.so.{VERSION}") == 2 and f"stub libnvidia-ml.so.{VERSION}" in out
    assert f"nvidia-smi (simulated NVIDIA driver {VERSION})" in out
    assert "gsp_ga10x.bin" in out
    assert "/dev/nvidia1" in out and "/dev/nvidia0" in out and "/dev/nvidiactl" in out
    assert "nvidia-cap" in out  # the MIG device's capability nodes

    read_only = podman_run(world, ids["gpu"], f"echo x > {LIBDIR}/libcuda.so.{VERSION}")
    assert read_only.returncode != 0
    assert "Read-only file system" in read_only.stdout + read_only.stderr

    driver.unprepare_resource_claims([ClaimRef("default", uid, uid)])
    gone = podman_run(world, ids["gpu"], "true")
    assert gone.returncode != 0
    assert "unresolvable CDI devices" in gone.stderr


def test_a_container_given_one_request_of_a_two_request_claim_sees_only_its_device(world: Path) -> None:
    driver = gpu_driver(world)
    ids = cdi_ids_by_request(driver, claim("7f00-two", ("first", GPU_A), ("second", GPU_B)))
    script = "ls /dev; env | grep DRADRIVER_DEVICE_; nvidia-smi"

    first = podman_run(world, ids["first"], script)
    assert first.returncode == 0, first.stderr
    devices = first.stdout.split()
    assert "nvidia1" in devices and "nvidia2" not in devices
    assert "DRADRIVER_DEVICE_GPU_0000_0F_00_0=GPU-" in first.stdout
    assert "GPU_0000_47_00_0" not in first.stdout
    assert "simulated NVIDIA driver" in first.stdout  # the claim's driver files come with either request

    second = podman_run(world, ids["second"], script)
    assert second.returncode == 0, second.stderr
    assert "nvidia2" in second.stdout.split() and "nvidia1" not in second.stdout.split()
    assert "GPU_0000_0F_00_0" not in second.stdout


def test_the_runtime_runs_nvidias_hooks_with_the_rendered_arguments(world: Path) -> None:
    driver = gpu_driver(world, hook=True)
    ids = cdi_ids_by_request(driver, claim("9a-hooks", ("gpu", GPU_A)))
    done = podman_run(world, ids["gpu"], f"cat {LIBDIR}/libcuda.so {LIBDIR}/libcuda.so.1")
    assert done.returncode == 0, done.stderr
    # Both links exist only because the hook made them: without a hook libcuda.so is not there at all.
    assert done.stdout.count(f"stub libcuda.so.{VERSION}") == 2
    calls = (world / "hook.log").read_text().splitlines()
    assert any(c.startswith("create-symlinks ") and f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in c for c in calls)
    assert f"enable-cuda-compat --host-driver-version={VERSION}" in calls
    assert "disable-device-node-modification" in calls
    assert f"update-ldcache --folder {LIBDIR} --folder /usr/lib64" in calls


class _Claims:
    def __init__(self, *claims: dict) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}

    def get_resource_claim(self, namespace: str, name: str) -> dict:
        return self.claims[(namespace, name)]


def test_a_container_reads_the_device_metadata_of_its_own_request_only(world: Path) -> None:
    spec_claim = claim("3c-meta", ("first", GPU_A), ("second", GPU_B))
    processor = ClaimProcessor(
        driver_name=DRIVER,
        handler=gpu_driver(world),
        claim_source=_Claims(spec_claim),
        locks=ClaimLocks(),
        device_metadata=DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=world / "plugin", cdi_dir=world / "cdi"),
    )
    result = processor.prepare([ClaimRef("default", "3c-meta", "3c-meta")])["3c-meta"]
    assert result.error is None
    first_ids = [i for d in result.devices if "first" in d.requests for i in d.cdi_device_ids]
    base = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/3c-meta"

    done = podman_run(world, first_ids, f"ls {base}; cat {base}/first/{DRIVER}-metadata.json")
    assert done.returncode == 0, done.stderr
    listed, _, document = done.stdout.partition("{")
    assert listed.split() == ["first"]
    metadata = json.loads("{" + document)
    [device] = metadata["requests"][0]["devices"]
    assert device["name"] == GPU_A and device["attributes"]["uuid"]["string"].startswith("GPU-")


def test_podman_sees_a_carved_mig_devices_uuid_and_capability_nodes(world: Path) -> None:
    gpulib, node = simulated_gpulib("hgx-h100-80gb", node_name="node-a")
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.DYNAMIC),
        inventory=discover(gpulib),
        cdi=CdiWriter(
            world / "cdi",
            host_path=lambda _path: "/dev/null",
            driver_root=discover_driver_root(
                host_root=str(write_stub_driver_root(world / "driver-root", VERSION)), version=VERSION
            ),
        ),
        gpulib=gpulib,
    )
    uid = "7a1d-mig-claim"
    partition = "gpu-0000-1b-00-0-mig-2g20gb-4"
    result = driver.prepare_resource_claims([typed(claim(uid, ("mig", partition)))])[uid]
    assert result.error is None
    [record] = driver.checkpoint.records()
    mig_uuid = record.devices[0].mig_uuid
    assert mig_uuid is not None and mig_uuid.startswith("MIG-")
    caps = [
        c.path for c in gpulib.mig_device(node.gpus[0].uuid, record.devices[0].gpu_instance_id or 0, 0).capability_nodes
    ]
    done = podman_run(
        world, list(result.devices[0].cdi_device_ids), f"env | grep DRADRIVER_DEVICE_; ls {' '.join(caps)}"
    )
    assert done.returncode == 0, done.stderr
    assert f"{device_env_name(partition)}={mig_uuid}" in done.stdout
    assert all(path in done.stdout for path in caps) and len(caps) == 2
    driver.unprepare_resource_claims([ClaimRef("default", uid, uid)])
    assert node.gpus[0].gpu_instances == {}
    gpulib.close()


def test_an_mps_container_shares_the_daemons_dev_shm_and_pipe_directory(world: Path) -> None:
    # The claim's shm tmpfs is the daemon's /dev/shm (the stand-in writes its marker there) and, through the CDI
    # spec, the container's; the daemon's socket is in the container's pipe directory.
    gpulib, _node = simulated_gpulib("mixed", node_name="node-a")
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=discover(gpulib),
        cdi=CdiWriter(world / "cdi", host_path=lambda _path: "/dev/null"),
        gpulib=gpulib,
        mps=MpsControl(mps_standin.command(), world / "mps"),
    )
    uid = "3c5e-mps-claim"
    mps_claim = claim(uid, ("gpu", GPU_A))
    parameters = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    mps_claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}
    ]
    ids = cdi_ids_by_request(driver, mps_claim)
    [daemon] = [a.params for a in driver.checkpoint.records()[0].actions if a.step == "mps-daemon"]
    done = podman_run(
        world,
        ids["gpu"],
        'echo pipe=$CUDA_MPS_PIPE_DIRECTORY; ls "$CUDA_MPS_PIPE_DIRECTORY" /dev/shm; grep /dev/shm /proc/mounts',
    )
    assert done.returncode == 0, done.stderr
    assert "pipe=/tmp/nvidia-mps" in done.stdout and mps_standin.SOCKET_NAME in done.stdout.split()
    assert Path(mps_standin.shm_marker(daemon["pid"])).name in done.stdout.split(), done.stdout
    assert done.stdout.splitlines()[-1].split()[2] == "tmpfs", done.stdout  # the last mount on /dev/shm: the claim's
    driver.unprepare_resource_claims([ClaimRef("default", uid, uid)])
    assert not (world / "mps" / uid).exists()
    gpulib.close()
