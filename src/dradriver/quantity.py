"""Kubernetes ``resource.Quantity``: parsing, exact arithmetic and canonical form.

A Kubernetes type, not a CEL one: the CEL `quantity` library, the allocator and the slice validator all use it.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_FORMAT = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Beyond this a decimal exponent names no real amount; refusing it keeps 10**exponent from taking minutes.
MAX_EXPONENT = 1000
_NANO = 10**9


class QuantityError(ValueError):
    """A string is not a Kubernetes quantity, or a quantity does not fit the requested form."""


@functools.total_ordering
class Quantity:
    """An exact quantity (``80Gi``, ``500m``, ``1e3``); compares by value, keeps its original spelling."""

    __slots__ = ("text", "value")

    def __init__(self, value: Fraction, text: str | None = None) -> None:
        self.value = value
        self.text = text if text is not None else _format(value)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        return _parse_cached(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(("quantity", self.value))

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def add(self, other: Quantity | int) -> Quantity:
        return Quantity(self.value + (other.value if isinstance(other, Quantity) else other))

    def sub(self, other: Quantity | int) -> Quantity:
        return Quantity(self.value - (other.value if isinstance(other, Quantity) else other))

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        return self.value.denominator == 1 and INT64_MIN <= self.value <= INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError(f"cannot convert value {self.text} to integer")
        return int(self.value)

    def as_float(self) -> float:
        try:
            return float(self.value)
        except OverflowError:  # Kubernetes' AsApproximateFloat64 gives ±Inf beyond the float range
            return math.inf if self.value > 0 else -math.inf


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    match = _FORMAT.match(text.strip()) if text == text.strip() else None
    if not match or not text:
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        power = int(exponent[1:])
        if power > MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent {power} is larger than {MAX_EXPONENT}")
        if power < -(len(number) + 10):
            # Far below 1n: only the sign survives Kubernetes' rounding, so skip computing 10**power.
            value = Fraction(value.numerator and (1 if value > 0 else -1), _NANO * 10)
        else:
            value *= Fraction(10) ** power
    elif suffix in _BINARY:
        value *= _BINARY[suffix]
    else:
        value *= _DECIMAL[suffix or ""]
    return Quantity(_round_to_nano(value), text)


def _round_to_nano(value: Fraction) -> Fraction:
    """resource.ParseQuantity rounds a non-zero value away from zero to a whole number of nanos."""
    nanos = value * _NANO
    if nanos.denominator == 1:
        return value
    magnitude = -(-abs(nanos.numerator) // nanos.denominator)
    return Fraction(magnitude if value > 0 else -magnitude, _NANO)


def is_quantity(text: str) -> bool:
    try:
        Quantity.parse(text)
    except QuantityError:
        return False
    return True


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        number = int(value)
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if number and number % _BINARY[suffix] == 0:
                return f"{number // _BINARY[suffix]}{suffix}"
        return str(number)
    for suffix in ("m", "u", "n"):
        scaled = value / _DECIMAL[suffix]
        if scaled.denominator == 1:
            return f"{int(scaled)}{suffix}"
    return f"{float(value)}"


def parse_quantity(value: object) -> Fraction | None:
    """The exact value of a Kubernetes quantity (``"80Gi"``, ``"100m"``, ``"1e3"``), or None if it does not
    parse. Integers are accepted as the API server accepts them in JSON."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    try:
        return Quantity.parse(value).value
    except QuantityError:
        return None
