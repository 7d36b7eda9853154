"""Runtime values of the evaluator and CEL's equality, ordering and arithmetic over them.

CEL types map onto Python as: bool → bool, int → int, uint → ``Uint``, double → float, string → str,
bytes → bytes, null → None, list → list, map → dict, type → ``CelType``; the Kubernetes types are
``Quantity`` and ``Semver``. Errors are raised as ``CelEvaluationError``.
"""

from __future__ import annotations

import math
from typing import Any

from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.net_ext import CIDRValue, IPValue
from dradriver.cel.semver import Semver
from dradriver.cel.time_ext import Duration, Timestamp
from dradriver.cel.time_ext import add as time_add
from dradriver.cel.time_ext import subtract as time_subtract
from dradriver.cel.url_ext import URLValue
from dradriver.quantity import Quantity

INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class Uint(int):
    """A CEL ``uint``: an int that keeps its type through the evaluator."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class CelType:
    """A type value, as returned by ``type(x)`` and named by the identifiers ``int``, ``string``, …"""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("type", self.name))

    def __repr__(self) -> str:
        return self.name


class OptionalValue:
    """A CEL ``optional_type`` value: ``optional.of(x)`` (``has`` true) or ``optional.none()``."""

    __slots__ = ("has", "value")

    def __init__(self, has: bool, value: Any = None) -> None:
        self.has = has
        self.value = value

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has else "optional.none()"


NONE = OptionalValue(False)

TYPE_NAMES = ("bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type", "type", "optional_type")


_KIND_NAMES: dict[type, str] = {
    bool: "bool",
    Uint: "uint",
    int: "int",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null_type",
    Quantity: "kubernetes.Quantity",
    Semver: "kubernetes.Semver",
    CelType: "type",
    OptionalValue: "optional_type",
    Timestamp: "google.protobuf.Timestamp",
    Duration: "google.protobuf.Duration",
    IPValue: "net.IP",
    CIDRValue: "net.CIDR",
    URLValue: "kubernetes.URL",
}


def type_name(value: Any) -> str:
    """The CEL type name of a runtime value."""
    kind = type(value)
    name = _KIND_NAMES.get(kind)
    if name is not None:
        return name
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return kind.__name__


def no_overload(function: str, *args: Any) -> CelEvaluationError:
    types = ", ".join(type_name(a) for a in args)
    return CelEvaluationError(f"no such overload: {function}({types})")


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or kind is float or kind is Uint


def equals(a: Any, b: Any) -> bool:
    """CEL ``==`` as cel-go evaluates it: heterogeneous (``dyn(1) == 1.0``; ``1 == "a"`` is false).

    The left operand decides, as cel-go calls ``lhs.Equal(rhs)``: a Kubernetes quantity or version compared
    with anything else is a "no such overload" error, but a string (or int, …) compared with a quantity
    or version is just false. null equals only null, whatever the other side.
    """
    kind = type(a)
    if kind is type(b) and (kind is str or kind is int or kind is bool):
        return bool(a == b)
    result = _equal(a, b)
    if result is None:
        raise no_overload("_==_", a, b)
    return result


def _equal(a: Any, b: Any) -> bool | None:
    """True, False, or None for an error (cel-go's MaybeNoSuchOverloadErr)."""
    ka, kb = type(a), type(b)
    if ka is kb and ka in (str, bool, int, bytes, Uint):
        return bool(a == b)
    if a is None or b is None:
        return a is None and b is None
    if ka is Quantity or ka is Semver or ka is IPValue or ka is CIDRValue:
        # k8s.io/apiserver: Quantity, Semver, IP and CIDR Equal answer "no such overload" for other types.
        return bool(a == b) if ka is kb else None
    if _is_number(a):
        if ka is bool or kb is bool or not _is_number(b):
            return False
        if ka is float or kb is float:
            return float(a) == float(b)  # as cel-go: the int side converted to double
        return bool(a == b)
    if isinstance(a, list):
        return _equal_lists(a, b)
    if isinstance(a, dict):
        return _equal_maps(a, b)
    if ka is OptionalValue:
        return _equal_optionals(a, b)
    if ka is not kb:
        return False
    return bool(a == b)


def _equal_lists(a: list[Any], b: Any) -> bool:
    if not isinstance(b, list) or len(a) != len(b):
        return False
    # an error between two elements does not make the lists unequal (cel-go: only False does)
    return all(_equal(x, y) is not False for x, y in zip(a, b, strict=True))


def _equal_maps(a: dict[Any, Any], b: Any) -> bool:
    if not isinstance(b, dict) or len(a) != len(b):
        return False
    for key, value in map_items(a):
        found, other = lookup(b, key)
        if not found:
            return False
        if (value is None or other is None) and value is not other:
            return False
        if _equal(value, other) is False:
            return False
    return True


def _equal_optionals(a: OptionalValue, b: Any) -> bool | None:
    if type(b) is not OptionalValue:
        return False
    if not a.has or not b.has:
        return bool(a.has == b.has)
    inner: bool | None = _equal(a.value, b.value)
    return inner


class BoolKey:
    """A ``bool`` key as a CEL map stores it. Python's ``True == 1`` (same hash) would make ``true`` and ``1`` one
    dict key, where CEL has two (bool and int are different types); map builders store bool keys as these and
    :func:`map_keys` / :func:`map_items` give the CEL values back."""

    __slots__ = ("value",)
    TRUE: BoolKey
    FALSE: BoolKey

    def __init__(self, value: bool) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is BoolKey and other.value is self.value

    def __hash__(self) -> int:
        return hash((BoolKey, self.value))

    def __repr__(self) -> str:
        return "true" if self.value else "false"


BoolKey.TRUE, BoolKey.FALSE = BoolKey(True), BoolKey(False)


def map_key(key: Any) -> Any:
    """How a CEL map stores ``key`` (bool keys apart from the ints 0 and 1)."""
    if type(key) is bool:
        return BoolKey.TRUE if key else BoolKey.FALSE
    return key


def cel_key(stored: Any) -> Any:
    """The CEL value of a stored map key."""
    return stored.value if type(stored) is BoolKey else stored


def map_keys(mapping: dict[Any, Any]) -> list[Any]:
    return [cel_key(k) for k in mapping]


def map_items(mapping: dict[Any, Any]) -> list[tuple[Any, Any]]:
    return [(cel_key(k), v) for k, v in mapping.items()]


def lookup(mapping: dict[Any, Any], key: Any) -> tuple[bool, Any]:
    """Find ``key`` in a CEL map; numeric keys match across int/uint/double, bool keys only bool keys."""
    kind = type(key)
    if kind is str or kind is bool or kind is BoolKey:
        stored = map_key(key)
        return (True, mapping[stored]) if stored in mapping else (False, None)
    if kind is float and not key.is_integer():
        return False, None
    for k, v in mapping.items():
        if type(k) is not BoolKey and type(k) is not bool and type(k) is not str and k == key:
            return True, v
    return False, None


def compare(function: str, a: Any, b: Any) -> int:
    """Order two values for ``<``, ``<=``, ``>``, ``>=``; numbers compare across int/uint/double."""
    ka, kb = type(a), type(b)
    if _is_number(a) and _is_number(b) and ka is not bool and kb is not bool:
        if ka is float or kb is float:
            # cel-go compares an int or uint with a double as doubles (lossy above 2**53, like cel-go)
            a, b = float(a), float(b)
            if math.isnan(a) or math.isnan(b):
                raise _NaN()
        return int(a > b) - int(a < b)
    if ka is kb and ka in (str, bytes, bool, Timestamp, Duration):
        return int(a > b) - int(a < b)
    raise no_overload(function, a, b)


class _NaN(Exception):
    """Comparisons with NaN are false rather than an error."""


def less(a: Any, b: Any) -> bool:
    try:
        return compare("_<_", a, b) < 0
    except _NaN:
        return False


def less_equal(a: Any, b: Any) -> bool:
    try:
        return compare("_<=_", a, b) <= 0
    except _NaN:
        return False


def greater(a: Any, b: Any) -> bool:
    try:
        return compare("_>_", a, b) > 0
    except _NaN:
        return False


def greater_equal(a: Any, b: Any) -> bool:
    try:
        return compare("_>=_", a, b) >= 0
    except _NaN:
        return False


def _check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise CelEvaluationError("integer overflow")
    return value


def _check_uint(value: int) -> Uint:
    if not 0 <= value <= UINT64_MAX:
        raise CelEvaluationError("unsigned integer overflow")
    return Uint(value)


def add(a: Any, b: Any) -> Any:
    if (type(a) is Timestamp or type(a) is Duration) and (type(b) is Timestamp or type(b) is Duration):
        if type(a) is Timestamp and type(b) is Timestamp:
            raise no_overload("_+_", a, b)
        return time_add(a, b)
    ka, kb = type(a), type(b)
    if ka is not kb:
        if isinstance(a, list) and isinstance(b, list):
            return [*a, *b]
        raise no_overload("_+_", a, b)
    if ka is int:
        return _check_int(a + b)
    if ka is Uint:
        return _check_uint(a + b)
    if ka in (float, str, bytes):
        return a + b
    if ka is list:
        return [*a, *b]
    raise no_overload("_+_", a, b)


def subtract(a: Any, b: Any) -> Any:
    if (type(a) is Timestamp or type(a) is Duration) and (type(b) is Timestamp or type(b) is Duration):
        if type(a) is Duration and type(b) is Timestamp:
            raise no_overload("_-_", a, b)
        return time_subtract(a, b)
    ka = type(a)
    if ka is not type(b):
        raise no_overload("_-_", a, b)
    if ka is int:
        return _check_int(a - b)
    if ka is Uint:
        return _check_uint(a - b)
    if ka is float:
        return a - b
    raise no_overload("_-_", a, b)


def multiply(a: Any, b: Any) -> Any:
    ka = type(a)
    if ka is not type(b):
        raise no_overload("_*_", a, b)
    if ka is int:
        return _check_int(a * b)
    if ka is Uint:
        return _check_uint(a * b)
    if ka is float:
        return a * b
    raise no_overload("_*_", a, b)


def divide(a: Any, b: Any) -> Any:
    ka = type(a)
    if ka is not type(b):
        raise no_overload("_/_", a, b)
    if ka is float:
        if b == 0:
            return math.copysign(math.inf, a) * math.copysign(1.0, b) if a != 0 else math.nan
        return a / b
    if ka is int or ka is Uint:
        if b == 0:
            raise CelEvaluationError("division by zero")
        quotient = abs(a) // abs(b)
        if (a < 0) != (b < 0):
            quotient = -quotient
        return _check_int(quotient) if ka is int else Uint(quotient)
    raise no_overload("_/_", a, b)


def modulo(a: Any, b: Any) -> Any:
    ka = type(a)
    if ka is not type(b) or ka not in (int, Uint):
        raise no_overload("_%_", a, b)
    if b == 0:
        raise CelEvaluationError("modulus by zero")
    if ka is int and a == INT64_MIN and b == -1:
        raise CelEvaluationError("integer overflow")  # cel-go: as for MinInt64 / -1
    remainder = abs(a) % abs(b)
    return (-remainder if a < 0 else remainder) if ka is int else Uint(remainder)


def negate(a: Any) -> Any:
    kind = type(a)
    if kind is int:
        return _check_int(-a)
    if kind is float:
        return -a
    raise no_overload("-_", a)


def contains(container: Any, item: Any) -> bool:
    """CEL ``in``: list membership by the item's ``==`` (an error counts as no match), map membership by key."""
    if isinstance(container, dict):
        return lookup(container, item)[0]
    if isinstance(container, list):
        return any(_equal(item, element) is True for element in container)
    raise no_overload("_in_", item, container)
