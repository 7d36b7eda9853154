"""``dradriver top``: which pod holds which GPU or MIG device on a node, and how busy it is, like nvidia-smi per pod.

It reads a running driver's status endpoint (``/allocations`` on ``--metrics-address``), so it needs no NVML, no
kubeconfig and no privileges: from a laptop, ``kubectl port-forward`` to the driver's pod and point ``--address`` at
the forwarded port."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.values import interval_seconds
from dradriver.cli.status_server import parse_address
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
        metavar="HOST:PORT",
        help="the driver's status endpoint (its --metrics-address; e.g. a `kubectl port-forward` of the pod)",
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
    host, port = parse_address("--address", address)
    host = "127.0.0.1" if host == "0.0.0.0" else f"[{host}]" if ":" in host else host  # ":8080": this machine
    url = f"http://{host}:{port}/allocations"
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


COLUMNS = ("GPU", "DEVICE", "PROFILE", "NAMESPACE/POD", "CLAIM", "SHARING", "UTIL", "MEMORY")


def render(document: dict[str, Any]) -> str:
    """The table: every GPU of the node, then one row per device a pod holds on it (idle GPUs show as free)."""
    usage = {str(u.get("uuid")): u for u in document.get("usage") or () if isinstance(u, dict)}
    held: dict[str, list[dict[str, Any]]] = {}
    for allocation in document["allocations"]:
        held.setdefault(str(allocation.get("gpu")), []).append(allocation)
    rows: list[tuple[str, ...]] = []
    gpus = [g for g in document.get("gpus") or () if isinstance(g, dict)]
    names = [str(g.get("name")) for g in gpus] + sorted(set(held) - {str(g.get("name")) for g in gpus})
    for name in names:
        gpu = next((g for g in gpus if g.get("name") == name), {})
        gpu_usage = usage.get(str(gpu.get("uuid")), {})
        rows.append((name, str(gpu.get("productName", "")), "", "", "", "", *_busy(gpu_usage)))
        for a in held.get(name, ()):
            pod = f"{a.get('namespace')}/{a.get('pod') or '(no pod)'}"
            device = "whole GPU" if a.get("device") == name else str(a.get("device", "")).removeprefix(f"{name}-")
            mine = usage.get(str(a.get("uuid")), {})
            busy = _busy(mine) if a.get("uuid") != gpu.get("uuid") else ("", "")
            pods = {(p.get("namespace"), p.get("pod")): p.get("memoryUsedBytes") for p in mine.get("pods") or ()}
            held_bytes = pods.get((a.get("namespace"), a.get("pod")))
            if isinstance(held_bytes, int):  # what this pod's processes hold, on a device it shares or not
                busy = (busy[0], _mib(held_bytes) + " (pod)")
            profile, claim, sharing = (str(a.get(k, "")) for k in ("migProfile", "claim", "sharing"))
            rows.append(("", f"└ {device}", profile, pod, claim, sharing, *busy))
        if not held.get(name):
            rows.append(("", "└ free", "", "", "", "", "", ""))
    return _table([COLUMNS, *rows]) + f"node {document.get('node', '?')}: {len(document['allocations'])} allocated\n"


def _busy(usage: dict[str, Any]) -> tuple[str, str]:
    """Utilisation and memory as nvidia-smi shows them; '-' where NVML does not report them (MIG devices have no
    utilisation), empty where nothing was sampled."""
    if not usage:
        return "", ""
    util = usage.get("utilizationPercent")
    used, total = usage.get("memoryUsedBytes"), usage.get("memoryTotalBytes")
    memory = f"{_mib(used)} / {_mib(total)}" if isinstance(used, int) and isinstance(total, int) else "-"
    return (f"{util}%" if isinstance(util, int) else "-"), memory


def _mib(value: int) -> str:
    return f"{value // (1 << 20)}MiB"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "".join(line.rstrip() + "\n" for line in lines)
