"""A stand-in for ``nvidia-imex`` and ``nvidia-imex-ctl`` on simulated nodes (run them as :func:`command` and
:func:`ctl_command` give). Standard library only, started without ``site``.

What it does, as the real tools do for what our daemon uses:

- ``daemon -c <cfg>`` reads the key=value config (an unknown key is fatal, which catches template drift), then the
  node list (``IMEX_NODE_CONFIG_FILE``, one name or address a line; the line is the node ID), resolved through a
  hosts file (``IMEX_STANDIN_HOSTS``, default ``/etc/hosts``). Its own node is the line that resolves to
  ``IMEX_CMD_BIND_INTERFACE_IP``; without one it exits with the real daemon's message. It listens for peers on
  ``<own address>:SERVER_PORT``, dials every other resolvable peer, and serves the command port on
  ``IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT``. SIGUSR1 re-reads the hosts file and reconnects; SIGTERM exits. A
  client that is slow to ask holds up no other, and one that hangs up first never ends the daemon.
- ``ctl -c <cfg> -q`` prints ``READY`` when the local daemon has loaded its config (local readiness, as the real
  ``-q``); ``-N`` prints the node table: ``<id> <name> <address> <C|N|I>`` (connected, not connected, itself).
- A host's IMEX service (host-managed ComputeDomains): with ``IMEX_CMD_ENABLED=1`` and ``IMEX_CMD_UNIX_DOMAIN_PATH``
  the daemon also answers on that Unix socket, and ``ctl -q --u=<socket>`` asks there (what the node plugin runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time

# How long a connection may take to ask or to read its answer before it is dropped.
CLIENT_TIMEOUT = 10.0
# What dradriver's daemon maps unused names to (computedomain/imexconf.py's SENTINEL_ADDRESS).
SENTINEL = "255.255.255.255"
KEYS = {
    "SERVER_PORT",
    "IMEX_NODE_CONFIG_FILE",
    "IMEX_CMD_BIND_INTERFACE_IP",
    "IMEX_CMD_PORT",
    "IMEX_CMD_ENABLED",
    "IMEX_CMD_UNIX_DOMAIN_PATH",
    "DAEMONIZE",
    "LOG_FILE_NAME",
    "IMEX_WAIT_FOR_QUORUM",
    "IMEX_NODE_DISCONNECTED_GRACE_TIME",
    "IMEX_ENABLE_AUTH_ENCRYPTION",
    "BIND_INTERFACE_IP",
}


def command() -> list[str]:
    """The daemon's command line (the cd-daemon's ``--imex-command`` on a simulated node)."""
    return [sys.executable, "-S", os.path.abspath(__file__), "daemon"]


def ctl_command() -> list[str]:
    """The control tool's command line (the cd-daemon's ``--imex-ctl-command`` on a simulated node)."""
    return [sys.executable, "-S", os.path.abspath(__file__), "ctl"]


def read_config(path: str) -> dict[str, str]:
    config: dict[str, str] = {}
    with open(path) as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep or key not in KEYS:
                sys.exit(f"{path}:{number}: unknown configuration {line!r}")
            config[key] = value
    return config


def resolve(names: list[str], hosts_path: str) -> list[str | None]:
    table: dict[str, str] = {}
    try:
        with open(hosts_path) as handle:
            for line in handle:
                fields = line.split("#", 1)[0].split()
                for name in fields[1:]:
                    table.setdefault(name, fields[0])
    except FileNotFoundError:
        pass
    return [table.get(name, name if name[:1].isdigit() else None) for name in names]


class Daemon:
    def __init__(self, config: dict[str, str]) -> None:
        self.config = config
        self.bind = config["IMEX_CMD_BIND_INTERFACE_IP"]
        self.port = int(config.get("SERVER_PORT", "50000"))
        with open(config["IMEX_NODE_CONFIG_FILE"]) as handle:
            self.names = [line.strip() for line in handle if line.strip()]
        self.hosts = os.environ.get("IMEX_STANDIN_HOSTS", "/etc/hosts")
        self.lock = threading.Lock()
        self.connected: set[int] = set()
        self.addresses: list[str | None] = []
        self.own = -1
        self.reload = threading.Event()
        self.load()

    def load(self) -> None:
        # An unused name (the sentinel address) is no peer: dialled, it fails at once; the table leaves it out.
        addresses = [None if a == SENTINEL else a for a in resolve(self.names, self.hosts)]
        own = [i for i, address in enumerate(addresses) if address == self.bind]
        if not own:
            sys.exit("No matching network interface found for any IP addresses in the node configuration file")
        with self.lock:
            self.addresses, self.own = addresses, own[0]
            self.connected.clear()

    def serve_peers(self) -> None:
        server = socket.create_server((self.bind, self.port))
        while True:
            peer, _ = server.accept()
            # A peer that hangs up first ends its own connection, never this service (the real daemon serves on).
            with contextlib.suppress(OSError), peer:
                peer.settimeout(CLIENT_TIMEOUT)
                peer.sendall(f"{self.own}\n".encode())

    def dial(self) -> None:
        while True:
            if self.reload.is_set():
                self.reload.clear()
                self.load()
            with self.lock:
                targets = [(i, a) for i, a in enumerate(self.addresses) if a and i != self.own]
            for index, address in targets:
                try:
                    with socket.create_connection((address, self.port), timeout=0.5) as peer:
                        answer = peer.recv(64).decode().strip()
                    ok = answer == str(index)
                except OSError:
                    ok = False
                with self.lock:
                    if ok:
                        self.connected.add(index)
                    else:
                        self.connected.discard(index)
            time.sleep(0.3)

    def table(self) -> str:
        with self.lock:
            rows = []
            for i, name in enumerate(self.names):
                address = self.addresses[i]
                if address is None:
                    continue
                state = "I" if i == self.own else ("C" if i in self.connected else "N")
                rows.append(f"{i} {name} {address} {state}")
            return "\n".join(rows) + "\n"

    def serve_commands(self) -> None:
        self.answer(socket.create_server((self.bind, int(self.config.get("IMEX_CMD_PORT", "50005")))))

    def serve_unix(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)  # a socket a killed daemon left
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen()
        self.answer(server)

    def answer(self, server: socket.socket) -> None:
        # Each client in a thread of its own: one that is slow to ask (a ctl on a loaded machine) never holds up the
        # next, and one that hangs up first (a ctl killed by its caller's timeout) never ends the daemon.
        while True:
            client, _ = server.accept()
            threading.Thread(target=self.answer_one, args=(client,), daemon=True).start()

    def answer_one(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            client.settimeout(CLIENT_TIMEOUT)
            request = client.recv(16).decode().strip()
            client.sendall(("READY\n" if request == "q" else self.table()).encode())


def run_daemon(config_path: str) -> None:
    daemon = Daemon(read_config(config_path))
    signal.signal(signal.SIGUSR1, lambda *_: daemon.reload.set())
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for target in (daemon.serve_peers, daemon.dial):
        threading.Thread(target=target, daemon=True).start()
    unix = daemon.config.get("IMEX_CMD_UNIX_DOMAIN_PATH", "")
    if unix and daemon.config.get("IMEX_CMD_ENABLED") == "1":
        threading.Thread(target=daemon.serve_unix, args=(unix,), daemon=True).start()
    daemon.serve_commands()


def run_ctl(config_path: str, request: str) -> None:
    config = read_config(config_path)
    address = (config["IMEX_CMD_BIND_INTERFACE_IP"], int(config.get("IMEX_CMD_PORT", "50005")))
    try:
        with socket.create_connection(address, timeout=2) as client:
            sys.stdout.write(ask(client, request))
    except OSError as err:
        sys.exit(f"cannot connect to the IMEX daemon at {address[0]}:{address[1]}: {err}")


def run_ctl_unix(path: str, request: str) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(2)
            client.connect(path)
            sys.stdout.write(ask(client, request))
    except OSError as err:
        sys.exit(f"cannot connect to the IMEX daemon at {path}: {err}")


def ask(client: socket.socket, request: str) -> str:
    client.sendall(request.encode() + b"\n")
    chunks = []
    while True:
        chunk = client.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def main(argv: list[str]) -> None:
    unix = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--u=")]
    if argv[:1] == ["ctl"] and unix:
        run_ctl_unix(unix[0], "q" if "-q" in argv[1:] else "N")
        return
    if len(argv) < 3 or argv[1] != "-c" or argv[0] not in ("daemon", "ctl"):
        sys.exit("usage: imex_standin.py daemon -c <cfg> | ctl -c <cfg> (-q | -N)")
    if argv[0] == "daemon":
        run_daemon(argv[2])
    else:
        run_ctl(argv[2], "q" if "-q" in argv[3:] else "N")


if __name__ == "__main__":
    main(sys.argv[1:])
