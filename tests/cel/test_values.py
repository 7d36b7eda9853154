from fractions import Fraction

import pytest

from dradriver.cel.semver import Semver, SemverError
from dradriver.quantity import Quantity, QuantityError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("500m", 0.5),
        ("1e3", 1000),
        ("1.5k", 1500),
        ("+2", 2),
        ("-1Ki", -1024),
        (".5", 0.5),
    ],
)
def test_quantity_parses_kubernetes_formats(text, value):
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1GB", "1.2.3", "0x10"])
def test_quantity_rejects_other_strings(text):
    with pytest.raises(QuantityError):
        Quantity.parse(text)


def test_semver_orders_prereleases_before_releases():
    versions = ["1.0.0", "1.0.0-rc.1", "1.0.0-beta.11", "1.0.0-beta.2", "1.0.0-alpha", "0.9.9"]
    ordered = sorted(versions, key=Semver.parse)
    assert ordered == ["0.9.9", "1.0.0-alpha", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]


@pytest.mark.parametrize("text", ["1.2", "v1.2.3", "01.2.3", "1.2.3-", "1.2.3+"])
def test_semver_is_strict_without_normalisation(text):
    with pytest.raises(SemverError):
        Semver.parse(text)


def test_semver_normalisation_matches_kubernetes():
    assert Semver.parse("v1.02", normalize=True) == Semver.parse("1.2.0")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-10", Fraction(1, 10**9)),
        ("0.1n", Fraction(1, 10**9)),
        ("-0.1n", Fraction(-1, 10**9)),
        ("1.0000000001", Fraction(1_000_000_001, 10**9)),
        ("1e-9999999999", Fraction(1, 10**9)),
        ("0e-9999999999", 0),
    ],
)
def test_quantity_rounds_below_a_nano_up_like_kubernetes(text, value):
    # resource.ParseQuantity rounds non-zero values away from zero to a multiple of 1n.
    assert Quantity.parse(text).value == value


def test_quantity_with_a_huge_exponent_is_rejected_quickly():
    with pytest.raises(QuantityError, match="exponent"):
        Quantity.parse("1e9999999999")
