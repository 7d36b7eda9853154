"""The opaque config API: strict decoding with field paths, resolution order and merging, the JSON schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dradriver.driver.prepare.config import (
    ConfigError,
    ConfigSource,
    DeviceTarget,
    GpuConfig,
    MigDeviceConfig,
    VfioDeviceConfig,
    decode_config,
    resolve_configs,
    schema_text,
)
from dradriver.errors import ClaimError
from tests.driver.prepare.config_table import BAD, GOOD, gpu, mig, nv_gpu, nv_mig

SCHEMA = Path(__file__).parents[3] / "api" / "config" / "gpu.dradriver.dev_v1alpha1.schema.json"


@pytest.mark.parametrize("config", GOOD)
def test_good_configs_decode(config: dict[str, Any]) -> None:
    decoded = decode_config(config)
    assert type(decoded).__name__ == config["kind"]
    assert isinstance(decoded, GpuConfig | MigDeviceConfig | VfioDeviceConfig)


@pytest.mark.parametrize(("config", "message"), BAD)
def test_bad_configs_name_the_field_and_what_is_allowed(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        decode_config(config)
    assert message in str(caught.value)


def test_time_slicing_without_settings_means_the_default_interval() -> None:
    decoded = decode_config(gpu(sharing={"strategy": "TimeSlicing"}))
    assert isinstance(decoded, GpuConfig) and decoded.sharing is not None
    assert decoded.sharing.strategy == "TimeSlicing" and decoded.sharing.time_slicing is None


GPU0 = DeviceTarget("gpu-0", ("a",), "gpu")
GPU1 = DeviceTarget("gpu-1", ("b",), "gpu")
MIG0 = DeviceTarget("gpu-2-mig-1g", ("c",), "mig")


def entry(parameters: dict[str, Any], *requests: str, source: str = "FromClaim") -> ConfigSource:
    return ConfigSource(source, tuple(requests), parameters)


def dump(config: Any) -> dict[str, Any]:
    return config.model_dump(by_alias=True, exclude_none=True)


def test_class_configs_come_first_and_claim_configs_win_field_by_field() -> None:
    claim = entry(gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}}))
    klass = entry(
        gpu(
            sharing={
                "strategy": "MPS",
                "mps": {"defaultActiveThreadPercentage": 80, "defaultPinnedDeviceMemoryLimit": "2Gi"},
            }
        ),
        source="FromClass",
    )
    resolved = resolve_configs("default/c", [claim, klass], [GPU0])
    assert dump(resolved["gpu-0"])["sharing"]["mps"] == {
        "defaultActiveThreadPercentage": 30,
        "defaultPinnedDeviceMemoryLimit": "2Gi",
    }


def test_an_entry_for_requests_applies_only_to_their_devices() -> None:
    resolved = resolve_configs("default/c", [entry(gpu(computeMode="Prohibited"), "b")], [GPU0, GPU1])
    assert list(resolved) == ["gpu-1"]


def test_a_config_for_a_request_applies_to_its_allocated_sub_request() -> None:
    sub = DeviceTarget("gpu-0", ("a/big",), "gpu")
    assert list(resolve_configs("default/c", [entry(gpu(computeMode="Default"), "a")], [sub])) == ["gpu-0"]


def test_an_entry_for_all_requests_configures_devices_of_its_own_kind() -> None:
    resolved = resolve_configs(
        "default/c", [entry(gpu(computeMode="Default")), entry(mig(sharing={"strategy": "MPS"}))], [GPU0, MIG0]
    )
    assert isinstance(resolved["gpu-0"], GpuConfig) and isinstance(resolved["gpu-2-mig-1g"], MigDeviceConfig)


def test_a_config_of_the_wrong_kind_for_a_request_is_refused() -> None:
    with pytest.raises(
        ClaimError,
        match="is a GpuConfig for requests c, but device gpu-2-mig-1g is a MIG partition; use kind MigDeviceConfig",
    ):
        resolve_configs("default/c", [entry(gpu(), "c")], [MIG0])


def test_two_strategies_for_one_device_are_refused() -> None:
    with pytest.raises(
        ClaimError,
        match=r"config entry 1 \(FromClass\) asks for sharing strategy TimeSlicing and config entry 0 "
        r"\(FromClaim\) for MPS",
    ):
        resolve_configs(
            "default/c",
            [
                entry(gpu(sharing={"strategy": "MPS"})),
                entry(gpu(sharing={"strategy": "TimeSlicing"}), source="FromClass"),
            ],
            [GPU0],
        )


def test_a_merge_that_makes_an_invalid_config_is_refused() -> None:
    with pytest.raises(
        ClaimError, match=r"the merged config is invalid: .*computeMode Prohibited cannot be used with MPS"
    ):
        resolve_configs(
            "default/c",
            [entry(gpu(sharing={"strategy": "MPS"}), source="FromClass"), entry(gpu(computeMode="Prohibited"))],
            [GPU0],
        )


def test_nvidia_configs_convert_to_ours_with_every_field() -> None:
    decoded = decode_config(
        nv_gpu(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"GPU-1": "5Gi"},
                    "multiUser": True,
                },
            }
        )
    )
    assert dump(decoded) == gpu(
        sharing={
            "strategy": "MPS",
            "mps": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"GPU-1": "5Gi"},
                "multiUser": True,
            },
        }
    )
    long = decode_config(nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))
    assert dump(long) == gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})


def test_nvidia_time_slicing_on_a_mig_device_is_accepted_and_sets_nothing() -> None:
    assert dump(decode_config(nv_mig(sharing={"strategy": "TimeSlicing"}))) == mig()


def test_an_nvidia_entry_replaces_earlier_entries_as_in_nvidias_driver() -> None:
    klass = entry(gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 80}}), source="FromClass")
    claim = entry(nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}))
    resolved = resolve_configs("default/c", [claim, klass], [GPU0])
    assert dump(resolved["gpu-0"])["sharing"] == {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}


def test_nvidia_configs_pick_devices_by_kind_like_ours() -> None:
    resolved = resolve_configs(
        "default/c",
        [entry(nv_gpu(sharing={"strategy": "TimeSlicing"})), entry(nv_mig(sharing={"strategy": "MPS"}))],
        [GPU0, MIG0],
    )
    assert dump(resolved["gpu-0"])["sharing"]["strategy"] == "TimeSlicing"
    assert dump(resolved["gpu-2-mig-1g"])["sharing"]["strategy"] == "MPS"


def test_a_malformed_entry_is_refused_naming_the_entry() -> None:
    with pytest.raises(ClaimError, match=r"claim default/c: config entry 0 \(FromClaim\): GpuConfig: computeMode"):
        resolve_configs("default/c", [entry(gpu(computeMode="Shared"))], [GPU0])


def test_the_checked_in_schema_is_current() -> None:
    assert SCHEMA.read_text() == schema_text(), (
        "regenerate: python -m dradriver.driver.prepare.config > api/config/gpu.dradriver.dev_v1alpha1.schema.json"
    )


def test_the_schema_command_prints_the_schema() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dradriver.driver.prepare.config"], capture_output=True, text=True, check=True
    )
    assert done.stdout == schema_text()


def _opaque_configs(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        opaque = node.get("opaque")
        if isinstance(opaque, dict) and opaque.get("driver") == "gpu.dradriver.dev":
            found.append(opaque["parameters"])
        for value in node.values():
            found.extend(_opaque_configs(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_opaque_configs(value))
    return found


EXAMPLES = sorted((Path(__file__).parents[3] / "examples").rglob("*.yaml"))


def test_every_config_in_the_examples_decodes() -> None:
    import yaml

    configs = [c for path in EXAMPLES for doc in yaml.safe_load_all(path.read_text()) for c in _opaque_configs(doc)]
    assert len(configs) >= 3
    for config in configs:
        decode_config(config)


VFIO = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"enableAPIDevice": True}}
PASSTHROUGH = DeviceTarget("gpu-0000-1b-00-0-vfio", ("vm",), "vfio")
WHOLE = DeviceTarget("gpu-0000-29-00-0", ("gpu",), "gpu")


def test_a_vfio_device_config_applies_to_passthrough_devices_only() -> None:
    resolved = resolve_configs("c", [ConfigSource("FromClaim", (), VFIO)], [PASSTHROUGH, WHOLE])
    assert set(resolved) == {PASSTHROUGH.name}
    assert isinstance(resolved[PASSTHROUGH.name], VfioDeviceConfig)


def test_a_vfio_device_config_naming_a_gpu_request_is_refused_saying_why() -> None:
    with pytest.raises(ClaimError) as caught:
        resolve_configs("c", [ConfigSource("FromClaim", ("vm", "gpu"), VFIO)], [PASSTHROUGH, WHOLE])
    assert (
        "is a VfioDeviceConfig for requests vm, gpu, but device gpu-0000-29-00-0 is a whole GPU; use kind GpuConfig "
        "for it (VfioDeviceConfig is for passthrough devices only)"
    ) in str(caught.value)


def test_a_gpu_config_naming_a_passthrough_request_is_refused() -> None:
    with pytest.raises(ClaimError) as caught:
        resolve_configs("c", [ConfigSource("FromClaim", ("vm",), gpu())], [PASSTHROUGH])
    assert "device gpu-0000-1b-00-0-vfio is a passthrough GPU; use kind VfioDeviceConfig for it" in str(caught.value)


def test_a_vfio_device_config_for_every_request_of_a_claim_without_passthrough_devices_is_refused() -> None:
    with pytest.raises(ClaimError) as caught:
        resolve_configs("c", [ConfigSource("FromClaim", (), VFIO)], [WHOLE, MIG0])
    assert (
        "is a VfioDeviceConfig, which is for passthrough devices only, but device gpu-0000-29-00-0 is a whole GPU"
        in (str(caught.value))
    )
