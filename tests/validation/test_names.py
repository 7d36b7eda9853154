"""Kubernetes name and value formats, and the trailing newline every user of them refuses (as Go's regexp does)."""

import argparse
from typing import Any

import pytest
from support.slice_rules import slice_errors

from dradriver.cel import compile_selector
from dradriver.cli.flags.values import dns_subdomain
from dradriver.errors import ConfigError
from dradriver.plugin.kubeletplugin.plugin import check_driver_name
from dradriver.validation import (
    is_c_identifier,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_qualified_name,
    is_semver,
    validate_claim,
)
from dradriver.validation.slices import validate_slice


@pytest.mark.parametrize(
    ("value", "expected"),
    [("gpu", True), ("gpu-0", True), ("a" * 63, True), ("a" * 64, False), ("-gpu", False), ("Gpu", False)],
)
def test_dns_label(value: str, expected: bool) -> None:
    assert is_dns_label(value) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpu.example.com", True),
        ("a" * 63 + "." + "b" * 189, True),
        ("a" * 254, False),
        ("gpu..example", False),
        ("gpu.example.", False),
        ("gpu_example", False),
    ],
)
def test_dns_subdomain(value: str, expected: bool) -> None:
    assert is_dns_subdomain(value) is expected


def test_dns_subdomain_limit_is_a_parameter() -> None:
    assert is_dns_subdomain("a" * 64) and not is_dns_subdomain("a" * 64, max_length=63)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("memory", True), ("gpu.dradriver.dev/uuid", True), ("_x9", True), ("9x", False), ("a" * 33, False)],
)
def test_qualified_name(value: str, expected: bool) -> None:
    assert is_qualified_name(value) is expected


def test_qualified_name_domain_is_at_most_63_characters() -> None:
    assert is_qualified_name("a" * 63 + "/x") and not is_qualified_name("a" * 64 + "/x")


def test_c_identifier_and_label_rules() -> None:
    assert is_c_identifier("cores_2") and not is_c_identifier("2cores")
    assert is_label_key("example.com/gpu.health") and not is_label_key("example.com/")
    assert is_label_value("") and is_label_value("a.b-c_d") and not is_label_value("-a")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1.2.3", True), ("1.2.3-rc.1+build.5", True), ("v1.2.3", False), ("01.2.3", False), ("1.2", False)],
)
def test_semver(value: str, expected: bool) -> None:
    assert is_semver(value) is expected


@pytest.mark.parametrize(
    "check",
    [is_dns_label, is_dns_subdomain, is_c_identifier, is_qualified_name, is_label_key, is_label_value, is_semver],
)
def test_a_trailing_newline_is_refused_by_every_rule(check: Any) -> None:
    good = {is_semver: "1.2.3", is_qualified_name: "gpu.dradriver.dev/uuid"}.get(check, "gpu")
    assert check(good)
    assert not check(good + "\n")


NEWLINE_DRIVER = "gpu.example.com\n"


def test_a_trailing_newline_is_refused_by_the_driver_flag() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        dns_subdomain("driver name")(NEWLINE_DRIVER)


def test_a_trailing_newline_is_refused_by_the_kubelet_plugin() -> None:
    with pytest.raises(ConfigError, match="is not a lower-case DNS subdomain"):
        check_driver_name(NEWLINE_DRIVER)


def test_a_trailing_newline_is_refused_by_claim_validation() -> None:
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"config": [{"opaque": {"driver": NEWLINE_DRIVER}}]}}}
    assert any("driver" in problem and "not a valid DNS subdomain" in problem for problem in validate_claim(claim))


def test_a_trailing_newline_is_refused_by_slice_validation_and_the_api_stand_in() -> None:
    pool = {"name": "p", "generation": 1, "resourceSliceCount": 1}
    resource_slice = {
        "metadata": {"name": "node-a-gpu"},
        "spec": {"driver": NEWLINE_DRIVER, "nodeName": "a", "pool": pool},
    }
    assert [problem.rule for problem in validate_slice(resource_slice)] == ["driver-name"]
    assert any("spec.driver" in error for error in slice_errors(resource_slice))


def test_a_trailing_newline_is_not_a_semver_in_cel() -> None:
    device: dict[str, Any] = {"attributes": {}, "capacity": {}}
    assert compile_selector('isSemver("1.2.3")').evaluate(device, driver="gpu.dradriver.dev") is True
    assert compile_selector('isSemver("1.2.3\\n")').evaluate(device, driver="gpu.dradriver.dev") is False
