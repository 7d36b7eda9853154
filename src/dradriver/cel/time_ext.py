"""CEL timestamps and durations (google.protobuf.Timestamp / Duration), as cel-go implements them.

A timestamp is nanoseconds since the Unix epoch, within 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z;
a duration is int64 nanoseconds (Go's time.Duration, about ±292 years). Parsing follows Go: RFC 3339
for timestamps, Go's duration syntax (``1h30m``, ``1.5s``, ``-300ms``) for durations.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from decimal import Decimal
from typing import Any

from dradriver.cel.errors import CelEvaluationError

NANOS = 1_000_000_000
MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
# cel-go's durations are Go's time.Duration: int64 nanoseconds (about ±292 years)
MIN_DURATION, MAX_DURATION = -(2**63), 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z"
)
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": NANOS, "m": 60 * NANOS}
_UNITS["h"] = 3600 * NANOS
_OFFSET = re.compile(r"([+-]?)(\d{2}):(\d{2})\Z")


class Timestamp:
    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        if not MIN_SECONDS * NANOS <= ns <= MAX_SECONDS * NANOS + NANOS - 1:
            raise CelEvaluationError("timestamp out of range")
        self.ns = ns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and other.ns == self.ns

    def __lt__(self, other: Timestamp) -> bool:
        return self.ns < other.ns

    def __gt__(self, other: Timestamp) -> bool:
        return self.ns > other.ns

    def __hash__(self) -> int:
        return hash(("timestamp", self.ns))

    def __repr__(self) -> str:
        return f"timestamp({timestamp_string(self)!r})"


class Duration:
    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        if not MIN_DURATION <= ns <= MAX_DURATION:
            raise CelEvaluationError("integer overflow: duration out of range")
        self.ns = ns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.ns == self.ns

    def __lt__(self, other: Duration) -> bool:
        return self.ns < other.ns

    def __gt__(self, other: Duration) -> bool:
        return self.ns > other.ns

    def __hash__(self) -> int:
        return hash(("duration", self.ns))

    def __repr__(self) -> str:
        return f"duration({duration_string(self)!r})"


def parse_timestamp(text: str) -> Timestamp:
    match = _RFC3339.match(text)
    if not match:
        raise CelEvaluationError(f"timestamp: cannot parse {text!r} as RFC 3339")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        moment = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=dt.UTC)
    except ValueError as err:
        raise CelEvaluationError(f"timestamp: cannot parse {text!r}: {err}") from None
    offset = 0 if zulu else (int(off_h) * 3600 + int(off_m) * 60) * (-1 if sign == "-" else 1)
    seconds = (moment - _EPOCH) // dt.timedelta(seconds=1) - offset
    nanos = int((fraction or "").ljust(9, "0"))
    return Timestamp(seconds * NANOS + nanos)


def timestamp_from_seconds(seconds: int) -> Timestamp:
    return Timestamp(seconds * NANOS)


def timestamp_string(value: Timestamp) -> str:
    """Go's RFC3339Nano in UTC: trailing zeros of the fraction dropped."""
    seconds, nanos = divmod(value.ns, NANOS)
    moment = _EPOCH + dt.timedelta(seconds=seconds)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if len(text) < 19:  # years below 1000 lose their zero padding on some platforms
        text = f"{moment.year:04d}" + text[text.index("-") :]
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{text}{fraction}Z"


def parse_duration(text: str) -> Duration:
    """Go's time.ParseDuration."""
    rest, sign = text, 1
    if rest[:1] in "+-" and rest:
        sign, rest = (-1 if rest[0] == "-" else 1), rest[1:]
    if rest == "0":
        return Duration(0)
    if not rest:
        raise CelEvaluationError(f"duration: invalid duration {text!r}")
    total, position = 0, 0
    while position < len(rest):
        match = _DURATION_PART.match(rest, position)
        if not match or match.group(1) in ("", "."):
            raise CelEvaluationError(f"duration: invalid duration {text!r}")
        number, unit = match.groups()
        whole, _, fraction = number.partition(".")
        scale = _UNITS[unit]
        total += int(whole or "0") * scale
        if fraction:
            total += int(Decimal("0." + fraction) * scale)
        if total > 2**63:
            raise CelEvaluationError(f"duration: invalid duration {text!r} (overflow)")
        position = match.end()
    return Duration(sign * total)


def duration_string(value: Duration) -> str:
    """cel-go: the seconds as Go's shortest fixed-point float, then "s"."""
    seconds = value.ns / NANOS
    text = format(Decimal(repr(seconds)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text}s"


def _zone(name: str) -> dt.tzinfo:
    match = _OFFSET.match(name)
    if match:
        sign, hours, minutes = match.groups()
        delta = dt.timedelta(hours=int(hours), minutes=int(minutes))
        return dt.timezone(-delta if sign == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CelEvaluationError(f"unknown time zone {name!r}") from None


def _local(value: Timestamp, zone: str | None) -> tuple[dt.datetime, int]:
    seconds, nanos = divmod(value.ns, NANOS)
    moment = _EPOCH + dt.timedelta(seconds=seconds)
    if zone is not None:
        try:
            moment = moment.astimezone(_zone(zone))
        except OverflowError:
            raise CelEvaluationError("timestamp out of range in that time zone") from None
    return moment, nanos


def _getter(part: str) -> Any:
    def get(value: Timestamp, zone: str | None = None) -> int:
        moment, nanos = _local(value, zone)
        return {
            "getFullYear": moment.year,
            "getMonth": moment.month - 1,
            "getDate": moment.day,
            "getDayOfMonth": moment.day - 1,
            "getDayOfWeek": (moment.weekday() + 1) % 7,
            "getDayOfYear": moment.timetuple().tm_yday - 1,
            "getHours": moment.hour,
            "getMinutes": moment.minute,
            "getSeconds": moment.second,
            "getMilliseconds": nanos // 1_000_000,
        }[part]

    return get


def _truncated(ns: int, unit: int) -> int:
    return -(-ns // unit) if ns < 0 else ns // unit


_DURATION_GETTERS = {
    "getHours": 3600 * NANOS,
    "getMinutes": 60 * NANOS,
    "getSeconds": NANOS,
    "getMilliseconds": 1_000_000,
}


def add(a: Any, b: Any) -> Any:
    if type(a) is Timestamp and type(b) is Duration:
        return Timestamp(a.ns + b.ns)
    if type(a) is Duration and type(b) is Timestamp:
        return Timestamp(a.ns + b.ns)
    return Duration(a.ns + b.ns)


def subtract(a: Any, b: Any) -> Any:
    if type(a) is Timestamp and type(b) is Timestamp:
        return Duration(a.ns - b.ns)
    if type(a) is Timestamp:
        return Timestamp(a.ns - b.ns)
    return Duration(a.ns - b.ns)


_T, _D, _S = "timestamp", "duration", "string"
TIME_FUNCTIONS: dict[str, tuple[tuple[bool, tuple[Any, ...], Any, Any], ...]] = {
    "timestamp": (
        (False, (_S,), _T, parse_timestamp),
        (False, ("int",), _T, timestamp_from_seconds),
        (False, (_T,), _T, lambda t: t),
    ),
    "duration": ((False, (_S,), _D, parse_duration), (False, (_D,), _D, lambda d: d)),
    "string": ((False, (_T,), _S, timestamp_string), (False, (_D,), _S, duration_string)),
    "int": ((False, (_T,), "int", lambda t: t.ns // NANOS),),
}
for _name in ("getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear"):
    TIME_FUNCTIONS[_name] = ((True, (_T,), "int", _getter(_name)), (True, (_T, _S), "int", _getter(_name)))
for _name, _unit in _DURATION_GETTERS.items():
    TIME_FUNCTIONS[_name] = (
        (True, (_T,), "int", _getter(_name)),
        (True, (_T, _S), "int", _getter(_name)),
        (True, (_D,), "int", lambda d, unit=_unit: _truncated(d.ns, unit)),
    )
