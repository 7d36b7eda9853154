"""CEL's type conversions ``int()``, ``uint()``, ``double()``, ``string()``, ``bool()`` and ``bytes()``, with
cel-go's results and errors.

Apart from the function table (library.py) because ``string.format``'s %s clause (format_ext.py) converts as
``string()`` does, and the table holds ``format`` too.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.values import INT64_MAX, INT64_MIN, UINT64_MAX, Uint, type_name

# What Go's strconv.ParseInt/ParseUint (base 10) and ParseFloat accept; Python's int() and float() also
# take blanks around the number and "_" between digits.
_GO_INT = re.compile(r"[+-]?[0-9]+\Z")
_GO_UINT = re.compile(r"[0-9]+\Z")
_GO_FLOAT = re.compile(r"(?i)(?:[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|inf|infinity)|nan)\Z")


def to_int(value: Any) -> int:
    """CEL ``int(value)`` of an int, uint, double or decimal string; out of the int64 range is an error."""
    kind = type(value)
    if kind is int or kind is Uint:
        if value > INT64_MAX:
            raise CelEvaluationError("integer overflow converting to int")
        return int(value)
    if kind is float:
        # cel-go: -2**63 itself is refused too (doubleToInt64Checked compares with <=)
        if math.isnan(value) or not INT64_MIN < value < 2.0**63:
            raise CelEvaluationError("double out of the int range")
        return int(value)
    if kind is str:
        if not _GO_INT.match(value):
            raise CelEvaluationError(f"cannot convert {value!r} to int")
        result = int(value, 10)
        if not INT64_MIN <= result <= INT64_MAX:
            raise CelEvaluationError("integer overflow converting to int")
        return result
    raise CelEvaluationError(f"no such overload: int({type_name(value)})")


def to_uint(value: Any) -> Uint:
    """CEL ``uint(value)`` of an int, uint, double or decimal string; out of the uint64 range is an error."""
    kind = type(value)
    if kind is int or kind is Uint:
        if value < 0:
            raise CelEvaluationError("negative value converting to uint")
        return Uint(value)
    if kind is float:
        if math.isnan(value) or not 0 <= value < 2.0**64:
            raise CelEvaluationError("double out of the uint range")
        return Uint(int(value))
    if kind is str:
        if not _GO_UINT.match(value):
            raise CelEvaluationError(f"cannot convert {value!r} to uint")
        result = int(value, 10)
        if not 0 <= result <= UINT64_MAX:
            raise CelEvaluationError("unsigned integer overflow converting to uint")
        return Uint(result)
    raise CelEvaluationError(f"no such overload: uint({type_name(value)})")


def to_double(value: Any) -> float:
    """CEL ``double(value)`` of a number or of a string Go's ParseFloat accepts."""
    if type(value) in (int, Uint, float):
        return float(value)
    if type(value) is str:
        if not _GO_FLOAT.match(value):
            raise CelEvaluationError(f"cannot convert {value!r} to double")
        return float(value)
    raise CelEvaluationError(f"no such overload: double({type_name(value)})")


def to_string(value: Any) -> str:
    """CEL ``string(value)`` of a scalar: doubles as Go's %g, bytes decoded as UTF-8."""
    kind = type(value)
    if kind is str:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind in (int, Uint):
        return str(int(value))
    if kind is float:
        return _go_g(value)
    if kind is bytes:
        try:
            return str(value.decode("utf-8"))
        except UnicodeDecodeError:
            raise CelEvaluationError("invalid UTF-8 in bytes converting to string") from None
    raise CelEvaluationError(f"no such overload: string({type_name(value)})")


def _go_g(value: float) -> str:
    """Go's ``fmt.Sprintf("%g", value)``, which cel-go's string(double) uses: the shortest digits that
    round-trip, in exponent form when the decimal exponent is below -4 or at least 6."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # repr gives the shortest digits that round-trip, as Go's shortest formatting does.
    parts = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, parts.digits))
    point = len(digits) + int(parts.exponent)  # the decimal point sits after this many digits
    digits = digits.rstrip("0")
    sign = "-" if value < 0 else ""
    exponent = point - 1
    if exponent < -4 or exponent >= 6:
        head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{head}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


_BOOL_STRINGS = {
    "1": True,
    "t": True,
    "true": True,
    "TRUE": True,
    "True": True,
    "0": False,
    "f": False,
    "false": False,
    "FALSE": False,
    "False": False,
}


def to_bool(value: Any) -> bool:
    """CEL ``bool(value)`` of a bool or of a string cel-go reads as one (``_BOOL_STRINGS``)."""
    if type(value) is bool:
        return bool(value)
    if type(value) is str and value in _BOOL_STRINGS:
        return _BOOL_STRINGS[value]
    raise CelEvaluationError(f"cannot convert {value!r} to bool")


def to_bytes(value: Any) -> bytes:
    """CEL ``bytes(value)`` of bytes or of a string (UTF-8)."""
    if type(value) is bytes:
        return bytes(value)
    if type(value) is str:
        return value.encode("utf-8")
    raise CelEvaluationError(f"no such overload: bytes({type_name(value)})")
