"""A stand-in for ``nvidia-cuda-mps-control`` on the simulated node (``python -m dradriver.gpu.mps_standin``).

It behaves as NVIDIA's MPS documentation describes the tool, for what the driver uses:

- ``-d`` starts the control daemon in the background and returns once it answers; ``-f`` runs it in the
  foreground. The daemon creates its control socket in ``CUDA_MPS_PIPE_DIRECTORY`` and logs to
  ``control.log`` in ``CUDA_MPS_LOG_DIRECTORY``.
- Without a flag it is the client: it sends the commands on stdin to the daemon of ``CUDA_MPS_PIPE_DIRECTORY``
  and prints the answers; it fails when no daemon serves that directory.
- Commands: ``get_server_list``, ``set_default_active_thread_percentage <n>``,
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <uuid> <n>M``,
  ``get_default_device_pinned_mem_limit <uuid>``, ``quit`` (the daemon removes its socket and exits).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET_NAME = "control"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, logs


def _serve() -> int:
    pipe, logs = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    path = pipe / SOCKET_NAME
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.chdir(pipe)  # a relative name: socket paths are limited to 108 bytes, state directories can be longer
    server.bind(SOCKET_NAME)
    server.listen(8)
    log = (logs / "control.log").open("a", buffering=1)
    log.write(f"[{time.time():.3f}] Startup pid={os.getpid()}\n")
    percentage = 100.0
    pinned: dict[str, str] = {}
    while True:
        conn, _ = server.accept()
        with conn:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            replies: list[str] = []
            quit_now = False
            for line in data.decode().splitlines():
                words = line.split()
                if not words:
                    continue
                log.write(f"[{time.time():.3f}] Command: {line.strip()}\n")
                command, args = words[0], words[1:]
                if command == "quit":
                    quit_now = True
                elif command == "get_server_list":
                    pass
                elif command == "set_default_active_thread_percentage" and len(args) == 1:
                    percentage = float(args[0])
                    replies.append(f"{percentage:.1f}")
                elif command == "get_default_active_thread_percentage":
                    replies.append(f"{percentage:.1f}")
                elif command == "set_default_device_pinned_mem_limit" and len(args) == 2:
                    pinned[args[0]] = args[1]
                elif command == "get_default_device_pinned_mem_limit" and len(args) == 1:
                    replies.append(pinned.get(args[0], "0M"))
                else:
                    replies.append(f"ERROR: unknown command {line.strip()!r}")
            conn.sendall(("\n".join(replies) + "\n").encode() if replies else b"")
        if quit_now:
            log.write(f"[{time.time():.3f}] Shutdown\n")
            path.unlink(missing_ok=True)
            return 0


def _client() -> int:
    pipe, _ = _dirs()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(pipe)
        client.connect(SOCKET_NAME)
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with client:
        client.sendall(sys.stdin.read().encode())
        client.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
    text = answer.decode()
    sys.stdout.write(text)
    return 1 if "ERROR" in text else 0


def _background() -> int:
    pipe, _ = _dirs()
    subprocess.Popen(
        [sys.executable, "-m", "dradriver.gpu.mps_standin", "-f"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (pipe / SOCKET_NAME).exists():
            return 0
        time.sleep(0.02)
    print("the MPS control daemon did not start", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if "-f" in argv:
        return _serve()
    if "-d" in argv:
        return _background()
    return _client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
