"""``dradriver top``: which pod holds which GPU or MIG device on a node, and how busy it is, like nvidia-smi per pod.

It reads a running driver's status endpoint (``/allocations`` on ``--metrics-address``), so it needs no NVML, no
kubeconfig and no privileges: from a laptop, ``kubectl port-forward`` to the driver's pod and point ``--address`` at
the forwarded port."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.values import interval_seconds
from dradriver.errors import ConfigError

DEFAULT_ADDRESS = "127.0.0.1:8080"
#: ANSI: cursor home, clear the screen (what `watch` and nvidia-smi -l do between frames).
_CLEAR = "\x1b[H\x1b[2J"


def register(parser: argparse.ArgumentParser) -> None:
    add_env_option(
        parser,
        "--address",
        env="DRADRIVER_TOP_ADDRESS",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT|URL",
        help="the driver's status endpoint (its --metrics-address; e.g. a `kubectl port-forward` of the pod): "
        "HOST:PORT, [IPv6]:PORT or http://HOST:PORT",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    parser.add_argument(
        "--interval",
        type=interval_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes of the table on a terminal (default: 2)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print once and exit (the default for JSON and when not on a terminal)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    once = args.once or args.output == "json" or not sys.stdout.isatty() or args.interval == 0
    pause = threading.Event()
    while True:
        document = fetch(args.address)
        if args.output == "json":
            print(json.dumps(document, indent=2))
        else:
            print(("" if once else _CLEAR) + render(document), end="", flush=True)
        if once:
            return 0
        pause.wait(args.interval)


def fetch(address: str, timeout: float = 5.0) -> dict[str, Any]:
    """The driver's /allocations document; a clear error when the driver cannot be reached."""
    url = allocations_url(address)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            document = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ConfigError(
            f"{url} answered {err.code}: is this a dradriver status endpoint of a version with /allocations?"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigError(
            f"cannot read {url} ({reason}); give --address the driver's --metrics-address, e.g. after "
            "`kubectl port-forward -n <namespace> pod/<driver pod> 8080`"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("allocations"), list):
        raise ConfigError(f"{url} did not answer an allocations document")
    return document


def allocations_url(address: str) -> str:
    """The /allocations URL of ``--address``: ``HOST:PORT``, ``:PORT`` (this machine), ``[IPv6]:PORT``, or the same
    as an ``http://`` URL (with ``/`` or ``/allocations`` after it, as a browser shows it). HTTPS is refused: the
    status server speaks plain HTTP."""
    hostport = address.strip()
    if "://" in hostport:
        parts = urllib.parse.urlsplit(hostport)
        if parts.scheme.lower() == "https":
            raise ConfigError(
                f"--address {address!r}: the driver's status server speaks plain HTTP, not HTTPS; "
                "give http://HOST:PORT or HOST:PORT"
            )
        if (
            parts.scheme.lower() != "http"
            or parts.path not in ("", "/", "/allocations")
            or parts.query
            or parts.fragment
            or "@" in parts.netloc
        ):
            raise _not_an_address(address)
        hostport = parts.netloc
    host, port = _host_and_port(address, hostport)
    return f"http://{host}:{port}/allocations"


def _host_and_port(address: str, hostport: str) -> tuple[str, int]:
    """``host`` ready for a URL (IPv6 in brackets; all interfaces → this machine) and the port, or a ConfigError."""
    host, colon, port = hostport.rpartition(":")
    if not colon or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _not_an_address(address)
    bracketed = host.startswith("[") and host.endswith("]")
    unbracketed = ":" in host and "[" not in host and "]" not in host
    host = host[1:-1] if bracketed else host
    if bracketed or unbracketed:  # IPv6: a literal address, nothing else
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise _not_an_address(address) from None
        if unbracketed:  # fe80::1:8080 is also the address fe80::1:8080 with no port: not guessed
            raise ConfigError(
                f"--address {address!r}: an IPv6 host goes in brackets, so that its port is not read as part of "
                f"it: write [{host}]:{port}"
            )
        return ("[::1]" if host == "::" else f"[{host}]"), int(port)
    if not _HOSTNAME.fullmatch(host):
        raise _not_an_address(address)
    return ("127.0.0.1" if host in ("", "0.0.0.0") else host), int(port)  # ":8080": this machine


#: A DNS name or IPv4 address (or nothing: this machine); no brackets, slashes, user names or spaces.
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|")


def _not_an_address(address: str) -> ConfigError:
    return ConfigError(
        f"--address {address!r} is not HOST:PORT, :PORT or http://HOST:PORT (a port from 1 to 65535; an IPv6 "
        "host in brackets, e.g. [::1]:8080)"
    )


COLUMNS = ("GPU", "DEVICE", "PROFILE", "NAMESPACE/POD", "CLAIM", "SHARING", "HEALTH", "UTIL", "MEMORY")
Row = tuple[str, ...]


def render(document: dict[str, Any]) -> str:
    """The table: every GPU of the node with its health, each followed by its MIG devices (held or free) and the
    devices pods hold on it (an idle GPU shows as free); then the lost GPUs; then a line per fault. While the
    driver's slices are not published, no device is free to a pod: those show as "not published"."""
    usage = {str(u.get("uuid")): u for u in _entries(document.get("usage"))}
    held: dict[str, list[dict[str, Any]]] = {}
    for allocation in _entries(document["allocations"]):
        held.setdefault(str(allocation.get("gpu")), []).append(allocation)
    gpus = _entries(document.get("gpus"))
    lost = _entries(document.get("lostGpus"))
    rows: list[Row] = []
    free = "free" if _published(document) else "not published"
    for gpu in gpus:
        rows += _gpu_rows(gpu, held.pop(str(gpu.get("name")), []), usage, free=free)
    for gone in lost:
        rows.append((_lost_name(gone), "", "", "", "", "", _lost_cell(gone), "", ""))
        rows += [_allocation_row(a, {}, usage) for a in held.pop(str(gone.get("name")), [])]
    for name in sorted(held):  # on a GPU the document does not list (a driver that lists none)
        rows += _gpu_rows({"name": name}, held[name], usage, free=free)
    return _table([COLUMNS, *rows]) + _summary(document, gpus, lost)


def _entries(value: Any) -> list[dict[str, Any]]:
    return [entry for entry in value or () if isinstance(entry, dict)]


def _published(document: dict[str, Any]) -> bool:
    """Whether the driver's slices are published (a driver of before the field was in the document: yes)."""
    return document.get("slicesPublished") is not False


def _gpu_rows(
    gpu: dict[str, Any], held: list[dict[str, Any]], usage: dict[str, dict[str, Any]], *, free: str = "free"
) -> list[Row]:
    """The GPU's row, a row per MIG device on it (its holders, or ``free``: what an unheld device is called), then
    the other devices pods hold on it."""
    name = str(gpu.get("name"))
    mig = "MIG" if gpu.get("migEnabled") else ""
    rows: list[Row] = [
        (name, str(gpu.get("productName", "")), mig, "", "", "", health_cell(gpu.get("health")), *_busy(usage, gpu))
    ]
    for device in _entries(gpu.get("migDevices")):
        holders = [a for a in held if a.get("device") == device.get("name")]
        if holders:
            rows += [_allocation_row(a, gpu, usage, device) for a in holders]
        else:
            short = str(device.get("name", "")).removeprefix(f"{name}-")
            busy = _busy(usage, device)
            rows.append(("", f"└ {short}", str(device.get("profile", "")), free, "", "", _health(device), *busy))
    listed = {d.get("name") for d in _entries(gpu.get("migDevices"))}
    rows += [_allocation_row(a, gpu, usage) for a in held if a.get("device") not in listed]
    if len(rows) == 1:
        rows.append(("", "└ no MIG devices" if mig else f"└ {free}", "", "", "", "", "", "", ""))
    return rows


def _allocation_row(
    a: dict[str, Any], gpu: dict[str, Any], usage: dict[str, dict[str, Any]], device: dict[str, Any] | None = None
) -> Row:
    """One device a pod holds: on a shared device, the memory its own processes hold."""
    name = str(a.get("gpu"))
    pod = f"{a.get('namespace')}/{a.get('pod') or '(no pod)'}"
    whole = a.get("device") == name
    label = "whole GPU" if whole else str(a.get("device", "")).removeprefix(f"{name}-")
    mine = usage.get(str(a.get("uuid")), {})
    busy = _busy(usage, a) if a.get("uuid") != gpu.get("uuid") else ("", "")
    pods = {(p.get("namespace"), p.get("pod")): p.get("memoryUsedBytes") for p in mine.get("pods") or ()}
    held_bytes = pods.get((a.get("namespace"), a.get("pod")))
    if isinstance(held_bytes, int):  # what this pod's processes hold, on a device it shares or not
        busy = (busy[0], _mib(held_bytes) + " (pod)")
    profile, claim, sharing = (str(a.get(k, "")) for k in ("migProfile", "claim", "sharing"))
    health = "" if whole or device is None else _health(device)
    return ("", f"└ {label}", profile, pod, claim, sharing, health, *busy)


def _health(entry: dict[str, Any]) -> str:
    return health_cell(entry.get("health"))


def health_cell(health: Any) -> str:
    """A device's health in a few characters: ``ok``, its faults (``XID 79``, ``ECC 5``, ``lost``), ``unknown``
    while it is not watched; an informational fault in brackets after ``ok``. Empty when the driver did not say."""
    if not isinstance(health, dict):
        return ""
    faults = [_fault(t) for t in _entries(health.get("taints"))]
    status = health.get("status")
    if status == "UNHEALTHY":
        return ", ".join(faults) or "unhealthy"
    if status == "UNKNOWN":
        return "unknown"
    if status == "HEALTHY":
        return "ok" + (f" ({', '.join(faults)})" if faults else "")
    return str(status or "")


def _fault(taint: dict[str, Any]) -> str:
    """``XID 79`` from a taint ``<driver>/xid=79``; ``ECC 5``, ``lost``; other causes by their key."""
    cause, value = str(taint.get("key", "")).rsplit("/", 1)[-1], str(taint.get("value") or "")
    if cause == "gpu-lost":
        return "lost"
    label = cause.upper() if cause in ("xid", "ecc") else cause
    return f"{label} {value}" if value else label


def _lost_cell(gone: dict[str, Any]) -> str:
    """``lost``, then the GPU's other faults (the XID that took it off the bus, say)."""
    health = gone.get("health")
    faults = [_fault(t) for t in _entries(health.get("taints"))] if isinstance(health, dict) else []
    return ", ".join(dict.fromkeys(["lost", *faults]))


def _lost_name(gone: dict[str, Any]) -> str:
    return str(gone.get("name") or f"(GPU index {gone.get('index')})")


def _summary(document: dict[str, Any], gpus: list[dict[str, Any]], lost: list[dict[str, Any]]) -> str:
    """The node line (how many devices are held, lost, unhealthy), then one line per fault with its message."""
    notes = [f"lost: {_lost_name(g)}: {g.get('reason', '')}" for g in lost]
    if not _published(document) and not document.get("waitingFor"):
        error = document.get("publishError") or "the driver has not published them yet"
        notes.insert(0, f"not published: no pod can be given these devices until the ResourceSlices are: {error}")
    for entry in [device for gpu in gpus for device in (gpu, *_entries(gpu.get("migDevices")))]:
        health = entry.get("health")
        if isinstance(health, dict) and health.get("status") in ("UNHEALTHY", "UNKNOWN") and health.get("message"):
            notes.append(f"{str(health['status']).lower()}: {entry.get('name')}: {health['message']}")
    line = f"node {document.get('node', '?')}: {len(document['allocations'])} allocated"
    unhealthy = sum(note.startswith("unhealthy:") for note in notes)
    line += f", {len(lost)} lost" if lost else ""
    line += f", {unhealthy} unhealthy" if unhealthy else ""
    if document.get("waitingFor"):
        line += f" (the driver is starting: {document['waitingFor']})"
    return "".join(f"{text}\n" for text in (line, *notes))


def _busy(usage: dict[str, dict[str, Any]], device: dict[str, Any]) -> tuple[str, str]:
    """Utilisation and memory of ``device`` (by its UUID) as nvidia-smi shows them; '-' where NVML does not
    report them (MIG devices have no utilisation), empty where nothing was sampled."""
    sampled = usage.get(str(device.get("uuid")))
    if not sampled:
        return "", ""
    util = sampled.get("utilizationPercent")
    used, total = sampled.get("memoryUsedBytes"), sampled.get("memoryTotalBytes")
    memory = f"{_mib(used)} / {_mib(total)}" if isinstance(used, int) and isinstance(total, int) else "-"
    return (f"{util}%" if isinstance(util, int) else "-"), memory


def _mib(value: int) -> str:
    return f"{value // (1 << 20)}MiB"


def _table(rows: list[Row]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "".join(line.rstrip() + "\n" for line in lines)
