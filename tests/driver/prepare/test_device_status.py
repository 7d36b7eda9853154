"""What a prepared device reports: claim status data and device metadata attributes."""

from support.nodes import inventory_of

from dradriver.driver.prepare.device_status import device_metadata_attributes, device_status_data
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
from dradriver.gpu.inventory import GpuDevice, MigMode, MigPartition

INVENTORY = inventory_of("mixed")
DEVICES = {d.name: d for d in INVENTORY.devices(MigMode.STATIC)}
GPU = DEVICES["gpu-0000-0f-00-0"]
MIG = DEVICES["gpu-0000-07-00-0-mig-3g20gb-0"]


def test_a_whole_gpu_reports_its_uuid_product_and_exclusive_use():
    assert isinstance(GPU, GpuDevice)
    assert device_status_data(GPU) == {
        "uuid": GPU.uuid,
        "productName": GPU.info.product_name,
        "sharing": {"strategy": "Exclusive"},
    }
    assert device_status_data(GPU, admin_access=True)["adminAccess"] is True
    shared = device_status_data(GPU, sharing={"strategy": "TimeSlicing", "interval": "Short"})
    assert shared["sharing"] == {"strategy": "TimeSlicing", "interval": "Short"}


def test_a_mig_device_reports_its_profile_parent_and_placement():
    assert isinstance(MIG, MigPartition)
    data = device_status_data(MIG)
    assert data["uuid"].startswith("MIG-")
    assert data["migProfile"] == "3g.20gb"
    assert data["parentUUID"] == MIG.parent.uuid
    assert data["placement"] == {"start": MIG.placement.start, "size": MIG.placement.size}


def test_metadata_attributes_are_those_the_slice_publishes_for_the_device():
    specs = build_slice_specs(INVENTORY, SliceSettings(driver="gpu.dradriver.dev", mig_mode=MigMode.STATIC))
    published = {d["name"]: d["attributes"] for s in specs for d in s.get("devices", ())}
    for device in (GPU, MIG):
        attributes = device_metadata_attributes(device)
        assert attributes.items() <= published[device.name].items()
        assert "uuid" in attributes and "resource.kubernetes.io/pciBusID" in attributes
