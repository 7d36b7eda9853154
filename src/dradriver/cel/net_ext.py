"""Kubernetes' IP and CIDR CEL libraries (k8s.io/apiserver/pkg/cel/library ip.go, cidr.go; 1.30+).

Parsing follows Go's net/netip as Kubernetes uses it: no IPv6 zones, no IPv4-mapped IPv6 addresses, no
leading zeros in IPv4 octets, and a CIDR is ``address/bits`` (host bits may be set; ``masked()`` clears
them).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from dradriver.cel.errors import CelEvaluationError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_BITS = re.compile(r"(?:0|[1-9][0-9]{0,2})\Z")


class IPValue:
    """A ``net.IP`` value."""

    __slots__ = ("address",)

    def __init__(self, address: Address) -> None:
        self.address = address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IPValue) and other.address == self.address

    def __hash__(self) -> int:
        return hash(("ip", self.address))

    def __repr__(self) -> str:
        return f"ip({str(self.address)!r})"


class CIDRValue:
    """A ``net.CIDR`` value: an address and a prefix length (the address may have host bits set)."""

    __slots__ = ("address", "bits")

    def __init__(self, address: Address, bits: int) -> None:
        self.address = address
        self.bits = bits

    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{self.address}/{self.bits}", strict=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDRValue) and (other.address, other.bits) == (self.address, self.bits)

    def __hash__(self) -> int:
        return hash(("cidr", self.address, self.bits))

    def __str__(self) -> str:
        return f"{self.address}/{self.bits}"

    def __repr__(self) -> str:
        return f"cidr({str(self)!r})"


def parse_address(text: str) -> Address:
    if "%" in text:
        raise CelEvaluationError(f"IP address {text!r} with zone value is not allowed")
    try:
        address = ipaddress.ip_address(text)
    except ValueError as err:
        raise CelEvaluationError(f"IP Address {text!r} parse error during conversion from string: {err}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise CelEvaluationError(f"IPv4-mapped IPv6 address {text!r} is not allowed")
    return address


def to_ip(text: str) -> IPValue:
    return IPValue(parse_address(text))


def is_ip(text: str) -> bool:
    try:
        parse_address(text)
    except CelEvaluationError:
        return False
    return True


def is_canonical(text: str) -> bool:
    return str(parse_address(text)) == text


def family(ip: IPValue) -> int:
    return ip.address.version


def _first_hextet(address: Address) -> int:
    return int(address) >> 112 if address.version == 6 else -1


def is_link_local_multicast(ip: IPValue) -> bool:
    address = ip.address
    if address.version == 4:
        return address in ipaddress.ip_network("224.0.0.0/24")
    return _first_hextet(address) & 0xFF0F == 0xFF02


def is_link_local_unicast(ip: IPValue) -> bool:
    address = ip.address
    if address.version == 4:
        return address in ipaddress.ip_network("169.254.0.0/16")
    return _first_hextet(address) & 0xFFC0 == 0xFE80


def is_global_unicast(ip: IPValue) -> bool:
    """Go's netip.Addr.IsGlobalUnicast: private addresses count; broadcast, loopback, multicast,
    link-local unicast and the unspecified address do not."""
    address = ip.address
    if address.version == 4 and address == ipaddress.IPv4Address("255.255.255.255"):
        return False
    return not (address.is_unspecified or address.is_loopback or address.is_multicast or is_link_local_unicast(ip))


def parse_cidr(text: str) -> CIDRValue:
    head, slash, bits = text.partition("/")
    if not slash or not _BITS.match(bits):
        raise CelEvaluationError(f"network address parse error during conversion from string: bad CIDR {text!r}")
    address = parse_address(head)
    length = int(bits)
    if length > address.max_prefixlen:
        raise CelEvaluationError(
            f"network address parse error during conversion from string: prefix length {length} too large"
        )
    return CIDRValue(address, length)


def is_cidr(text: str) -> bool:
    try:
        parse_cidr(text)
    except CelEvaluationError:
        return False
    return True


def contains_ip(cidr: CIDRValue, other: Any) -> bool:
    ip = other if isinstance(other, IPValue) else to_ip(other)
    return ip.address.version == cidr.address.version and ip.address in cidr.network()


def contains_cidr(cidr: CIDRValue, other: Any) -> bool:
    inner = other if isinstance(other, CIDRValue) else parse_cidr(other)
    if inner.address.version != cidr.address.version:
        return False
    return inner.address in cidr.network() and cidr.bits <= inner.bits


def masked(cidr: CIDRValue) -> CIDRValue:
    return CIDRValue(cidr.network().network_address, cidr.bits)


_I, _C, _S = "IP", "CIDR", "string"
NET_FUNCTIONS: dict[str, tuple[tuple[bool, tuple[Any, ...], Any, Any], ...]] = {
    "ip": ((False, (_S,), _I, to_ip), (True, (_C,), _I, lambda c: IPValue(c.address))),
    "isIP": ((False, (_S,), "bool", is_ip),),
    "ip.isCanonical": ((False, (_S,), "bool", is_canonical),),
    "family": ((True, (_I,), "int", family),),
    "isUnspecified": ((True, (_I,), "bool", lambda ip: ip.address.is_unspecified),),
    "isLoopback": ((True, (_I,), "bool", lambda ip: ip.address.is_loopback),),
    "isLinkLocalMulticast": ((True, (_I,), "bool", is_link_local_multicast),),
    "isLinkLocalUnicast": ((True, (_I,), "bool", is_link_local_unicast),),
    "isGlobalUnicast": ((True, (_I,), "bool", is_global_unicast),),
    "cidr": ((False, (_S,), _C, parse_cidr),),
    "isCIDR": ((False, (_S,), "bool", is_cidr),),
    "containsIP": ((True, (_C, _S), "bool", contains_ip), (True, (_C, _I), "bool", contains_ip)),
    "containsCIDR": ((True, (_C, _S), "bool", contains_cidr), (True, (_C, _C), "bool", contains_cidr)),
    "prefixLength": ((True, (_C,), "int", lambda c: c.bits),),
    "masked": ((True, (_C,), _C, masked),),
    "string": ((False, (_I,), _S, lambda ip: str(ip.address)), (False, (_C,), _S, str)),
}
