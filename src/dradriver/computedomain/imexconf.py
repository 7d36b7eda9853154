"""The files the IMEX daemon reads: its config, the static nodes list, and the name→address map (hosts file).

Peers are named by index (``compute-domain-daemon-0003``), never by IP address, so every member's node list is
identical (a line's position is the IMEX node ID) and a changed address is a hosts-file edit plus SIGUSR1,
not a restart of the ensemble.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dradriver.computedomain import api

SERVER_PORT = 50000
CMD_PORT = 50005
_MARK = "compute-domain-daemon-"
#: The address of every unused name of the node list. Resolved, a name is never looked up in DNS (with the pod's
#: ndots and search domains, each lookup is several queries, repeated while IMEX retries); and this address is no
#: host's, so IMEX never reaches a pod that has since been given a departed peer's IP (NVIDIA's #1447 and #1465:
#: a dying daemon of an old domain told the new domain's daemon at that address to shut down). A TCP connection to
#: it fails at once.
SENTINEL_ADDRESS = "255.255.255.255"


def render_config(*, pod_ip: str, nodes_file: Path) -> str:
    """``imexd.cfg``: peers on SERVER_PORT, the command service on the pod's address (what ``-q`` asks)."""
    settings = {
        "SERVER_PORT": SERVER_PORT,
        "IMEX_NODE_CONFIG_FILE": nodes_file,
        "IMEX_CMD_BIND_INTERFACE_IP": pod_ip,
        "IMEX_CMD_PORT": CMD_PORT,
        "IMEX_CMD_ENABLED": 1,
        "DAEMONIZE": 0,
        "LOG_FILE_NAME": "",
        "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
        "IMEX_NODE_DISCONNECTED_GRACE_TIME": -1,
        "IMEX_ENABLE_AUTH_ENCRYPTION": 0,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def render_nodes(max_nodes: int = api.MAX_NODES_PER_IMEX_DOMAIN) -> str:
    """``nodes.cfg``: every name the clique may use, in index order, the same on every member."""
    return "".join(api.daemon_dns_name(i) + "\n" for i in range(max_nodes))


def rewrite_hosts(current: str, peers: Mapping[int, str], max_nodes: int = api.MAX_NODES_PER_IMEX_DOMAIN) -> str:
    """``current`` hosts-file text with our lines replaced by one ``<ip>\\t<name>`` per name of the node list: the
    peer's address (index → IP), or SENTINEL_ADDRESS for a name no daemon holds."""
    kept = [line for line in current.splitlines() if _MARK not in line]
    count = max(max_nodes, max(peers, default=-1) + 1)
    ours = [f"{peers.get(index, SENTINEL_ADDRESS)}\t{api.daemon_dns_name(index)}" for index in range(count)]
    return "\n".join(kept + ours) + "\n"
