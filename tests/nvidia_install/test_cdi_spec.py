"""The CDI spec a prepared claim gets on a simulated node with its stub driver root, checked against the CDI
specification: a whole GPU, two GPUs across two requests, a MIG device, admin access, hooks or their fallback."""

import json
from pathlib import Path

import pytest
from support.cdi_schema import cdi_problems
from support.nodes import inventory_of

from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode
from dradriver.gpu.models import DeviceNode
from dradriver.nvidia_install.cdi import CdiWriter, ClaimSpec, cdi_device, minimum_cdi_version
from dradriver.nvidia_install.driver_root import DriverRoot, discover_driver_root
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import allocated_claim
from dradriver.sim.driver_root import write_stub_driver_root

DRIVER = "gpu.dradriver.dev"
VERSION = "580.65.06"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
GPU_A = "gpu-0000-0f-00-0"
GPU_B = "gpu-0000-47-00-0"
MIG = "gpu-0000-07-00-0-mig-3g20gb-0"


def claim(uid: str, *results: tuple[str, str], admin: bool = False) -> dict:
    return {
        "metadata": {"uid": uid, "name": f"claim-{uid}", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": "node-a", "device": d, "adminAccess": admin}
                        for r, d in results
                    ]
                }
            }
        },
    }


def driver_root(tmp_path: Path, *, hook: bool, host_root: str | None = None) -> DriverRoot:
    root = write_stub_driver_root(tmp_path / "driver-root", VERSION, machine="x86_64")
    if hook:
        (root / "usr/bin/nvidia-cdi-hook").write_text("#!/bin/sh\n")
    return discover_driver_root(
        host_root=host_root or str(root), container_root=root, version=VERSION, machine="x86_64"
    )


def prepare(tmp_path: Path, root: DriverRoot, spec_claim: dict) -> dict:
    writer = CdiWriter(tmp_path / "cdi", driver_root=root, node_exists=lambda _p: True)
    gpus = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=inventory_of("mixed"),
        cdi=writer,
    )
    uid = spec_claim["metadata"]["uid"]
    ref = ClaimRef(spec_claim["metadata"]["namespace"], spec_claim["metadata"]["name"], uid)
    result = gpus.prepare_resource_claims([allocated_claim(spec_claim, ref, DRIVER)])[uid]
    assert result.error is None
    spec = json.loads(writer.spec_path(uid).read_text())
    assert cdi_problems(spec, max_version="0.5.0") == []  # podman 4.3's library knows up to 0.5.0
    return spec


def by_name(spec: dict) -> dict[str, dict]:
    return {d["name"].split("-", 1)[1]: d["containerEdits"] for d in spec["devices"]}


def test_a_whole_gpu_gets_its_node_its_uuid_and_the_driver_files_read_only(tmp_path: Path):
    root = driver_root(tmp_path, hook=True, host_root="/run/nvidia/driver")
    spec = prepare(tmp_path, root, claim("u1", ("gpu", GPU_A)))
    device = by_name(spec)[GPU_A]
    assert device["deviceNodes"] == [{"path": "/dev/nvidia1"}]
    [env] = device["env"]
    assert env.startswith("DRADRIVER_DEVICE_GPU_0000_0F_00_0=GPU-")
    common = spec["containerEdits"]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    libcuda = mounts[f"{LIBDIR}/libcuda.so.{VERSION}"]
    assert libcuda["hostPath"] == f"/run/nvidia/driver{LIBDIR}/libcuda.so.{VERSION}"  # container root rewritten
    assert libcuda["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control", f"{LIBDIR}/libnvidia-ml.so.{VERSION}"} <= set(
        mounts
    )
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in mounts
    assert all("ro" in m["options"] for m in common["mounts"])


def test_hooks_recreate_soname_links_and_the_linker_cache_where_the_host_has_nvidia_cdi_hook(tmp_path: Path):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=True, host_root="/"), claim("u1", ("gpu", GPU_A)))
    symlinks, compat, no_mknod, ldcache = spec["containerEdits"]["hooks"]
    hooks = (symlinks, compat, no_mknod, ldcache)
    assert {h["hookName"] for h in hooks} == {"createContainer"}
    assert {h["path"] for h in hooks} == {"/usr/bin/nvidia-cdi-hook"}
    assert no_mknod["args"] == ["nvidia-cdi-hook", "disable-device-node-modification"]
    assert symlinks["args"][:2] == ["nvidia-cdi-hook", "create-symlinks"]
    links = symlinks["args"][2:]
    assert links[::2] == ["--link"] * (len(links) // 2)
    assert f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in links
    assert f"libcuda.so.1::{LIBDIR}/libcuda.so" in links
    assert f"libcuda.so.{VERSION}::/usr/lib64/libcuda.so.1" in links
    # CUDA forward compatibility (an image's newer compat libraries), then the cache with every library directory.
    assert compat["args"] == ["nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={VERSION}"]
    assert ldcache["args"] == ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR, "--folder", "/usr/lib64"]
    # The links come from the hook, so they are not mounted as files.
    assert f"{LIBDIR}/libcuda.so.1" not in {m["containerPath"] for m in spec["containerEdits"]["mounts"]}


def test_without_the_hook_the_soname_links_are_mounted_as_files(tmp_path: Path):
    root = driver_root(tmp_path, hook=False)
    spec = prepare(tmp_path, root, claim("u1", ("gpu", GPU_A)))
    assert "hooks" not in spec["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts[f"{LIBDIR}/libcuda.so.1"] == f"{root.host_root}{LIBDIR}/libcuda.so.{VERSION}"
    assert mounts["/usr/lib64/libcuda.so.1"] == f"{root.host_root}{LIBDIR}/libcuda.so.{VERSION}"
    assert f"{LIBDIR}/libcuda.so" not in mounts  # a link only the hook creates


def test_two_gpus_of_two_requests_are_two_devices_each_with_only_its_own_node_and_env(tmp_path: Path):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=False), claim("u2", ("first", GPU_A), ("second", GPU_B)))
    devices = by_name(spec)
    assert devices[GPU_A]["deviceNodes"] == [{"path": "/dev/nvidia1"}]
    assert devices[GPU_B]["deviceNodes"] == [{"path": "/dev/nvidia2"}]
    assert [e.split("=")[0] for e in devices[GPU_A]["env"]] == ["DRADRIVER_DEVICE_GPU_0000_0F_00_0"]
    assert [e.split("=")[0] for e in devices[GPU_B]["env"]] == ["DRADRIVER_DEVICE_GPU_0000_47_00_0"]
    # Nothing in the spec-wide edits names a GPU: a container given one request learns nothing of the other.
    common = json.dumps(spec["containerEdits"])
    assert "GPU-" not in common and "/dev/nvidia1" not in common and "/dev/nvidia2" not in common


def test_a_mig_device_gets_its_parents_node_its_capability_nodes_and_its_mig_uuid(tmp_path: Path):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=False), claim("u3", ("mig", MIG)))
    device = by_name(spec)[MIG]
    parent, *caps = device["deviceNodes"]
    assert parent == {"path": "/dev/nvidia0"}
    assert len(caps) == 2
    # The simulated node has no nvidia-caps major; a real node's nodes are fully described
    # (tests/nvidia_install/test_cdi.py).
    assert all(cap["path"].startswith("/dev/nvidia-caps/nvidia-cap") for cap in caps)
    [env] = device["env"]
    assert env.startswith("DRADRIVER_DEVICE_GPU_0000_07_00_0_MIG_3G20GB_0=MIG-")


def test_admin_access_marks_the_device_and_gives_it_the_same_edits(tmp_path: Path):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=False), claim("u4", ("monitor", GPU_A), admin=True))
    device = by_name(spec)[GPU_A]
    assert device["deviceNodes"] == [{"path": "/dev/nvidia1"}]
    assert "DRA_ADMIN_ACCESS=true" in device["env"]


def test_the_version_is_the_minimum_the_content_needs(tmp_path: Path):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=True), claim("u5", ("gpu", GPU_A)))
    assert spec["cdiVersion"] == "0.3.0"  # mounts without a type and hooks are 0.3.0 features
    digits = prepare(tmp_path, driver_root(tmp_path, hook=True), claim("5u", ("gpu", GPU_B)))
    assert digits["cdiVersion"] == "0.5.0"
    typed = {**spec, "containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}}
    assert minimum_cdi_version(typed) == "0.4.0"


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        ({"cdiVersion": "0.6.0"}, "unknown to a library"),
        ({"devices": []}, "should be non-empty"),
        ({"kind": "nokind"}, "not vendor/class"),
        ({"extra": 1}, "Additional properties"),
    ],
)
def test_the_schema_check_rejects_what_the_cdi_library_rejects(tmp_path: Path, broken: dict, problem: str):
    spec = prepare(tmp_path, driver_root(tmp_path, hook=True), claim("u6", ("gpu", GPU_A)))
    assert any(problem in p for p in cdi_problems({**spec, **broken}, max_version="0.5.0"))


def test_nvidia_s_void_device_list_mount_is_in_every_spec(tmp_path: Path):
    # NVIDIA's runtime, with its volume-mounts device strategy, reads "void" there as "no devices".
    for hook in (True, False):
        spec = prepare(tmp_path, driver_root(tmp_path, hook=hook), claim(f"v{hook:d}", ("gpu", GPU_A)))
        void = [m for m in spec["containerEdits"]["mounts"] if m["hostPath"] == "/dev/null"]
        assert void == [
            {
                "hostPath": "/dev/null",
                "containerPath": "/var/run/nvidia-container-devices/void",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        ]


@pytest.mark.parametrize(("says", "profile"), [("1.20.2", True), ("1.20.0", True), ("1.17.8", False), ("", False)])
def test_update_application_profile_only_where_the_hook_has_it(tmp_path: Path, says: str, profile: bool):
    # A spec naming a subcommand the hook lacks would fail every container: the hook is asked its version.
    root = write_stub_driver_root(tmp_path / "driver-root", VERSION, machine="x86_64")
    hook = root / "usr/bin/nvidia-cdi-hook"
    hook.write_text(f"#!/bin/sh\necho 'NVIDIA CDI Hook version {says}'\n" if says else "#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    found = discover_driver_root(host_root="/", container_root=root, version=VERSION, machine="x86_64")
    assert found.cdi_hook == "/usr/bin/nvidia-cdi-hook" and found.cdi_hook_version == (says or None)
    spec = prepare(tmp_path, found, claim("u7", ("gpu", GPU_A)))
    last = spec["containerEdits"]["hooks"][-1]
    assert (last["args"] == ["nvidia-cdi-hook", "update-application-profile"]) is profile


def test_a_gpu_s_dri_nodes_come_with_their_by_path_links_made_by_the_hook(tmp_path: Path):
    gpu = next(g for g in inventory_of("mixed").gpus if g.name == GPU_A)
    nodes = (DeviceNode("/dev/nvidia1"), DeviceNode("/dev/dri/card2"), DeviceNode("/dev/dri/renderD129"))
    device = cdi_device(gpu, nodes)
    assert device.links == (
        ("../card2", "/dev/dri/by-path/pci-0000:0f:00.0-card"),
        ("../renderD129", "/dev/dri/by-path/pci-0000:0f:00.0-render"),
    )
    with_hook = CdiWriter(tmp_path, driver_root=driver_root(tmp_path / "a", hook=True), node_exists=lambda _p: True)
    [hook] = with_hook.render(ClaimSpec("u8", (device,)))["devices"][0]["containerEdits"]["hooks"]
    assert hook["args"] == [
        "nvidia-cdi-hook",
        "create-symlinks",
        "--link",
        "../card2::/dev/dri/by-path/pci-0000:0f:00.0-card",
        "--link",
        "../renderD129::/dev/dri/by-path/pci-0000:0f:00.0-render",
    ]
    # Without a hook nothing can make a link: the nodes alone.
    without = CdiWriter(tmp_path, driver_root=driver_root(tmp_path / "b", hook=False), node_exists=lambda _p: True)
    assert "hooks" not in without.render(ClaimSpec("u8", (device,)))["devices"][0]["containerEdits"]
