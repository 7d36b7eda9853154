"""A stand-in for ``nvidia-cuda-mps-control`` on the simulated node (run it as :func:`command` gives).

It behaves as NVIDIA's MPS documentation describes the tool, for what the driver uses:

- ``-d`` starts the control daemon in the background and returns once it answers; ``-f`` runs it in the
  foreground. The daemon creates its control socket in ``CUDA_MPS_PIPE_DIRECTORY`` and logs to
  ``control.log`` in ``CUDA_MPS_LOG_DIRECTORY``. As the real one creates its shared memory in ``/dev/shm``,
  it writes a marker there, ``/dev/shm/dradriver-mps-standin.<its pid>``, removed when it quits: a client
  that sees it shares the daemon's ``/dev/shm``.
- Without a flag it is the client: it sends the commands on stdin to the daemon of ``CUDA_MPS_PIPE_DIRECTORY``
  and prints the answers; it fails when no daemon serves that directory.
- Commands: ``get_server_list``, ``set_default_active_thread_percentage <n>``,
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit <uuid> <n>M``,
  ``get_default_device_pinned_mem_limit <uuid>``, ``quit`` (the daemon removes its socket and exits).

The real tool is a small C program that starts in a millisecond or two; an interpreter does not. So the stand-in
imports only what the client needs (the daemon and ``-d`` import the rest when they run) and :func:`command` starts
it without ``site``: a call costs about 10 ms instead of 50-70 ms, which keeps the stand-in from dominating what
the benchmark measures of an MPS claim.
"""

# The C module under ``socket``: ``socket`` itself imports enum and selectors, which takes longer than the rest of
# the client's work together.
import _socket
import io  # already loaded by the interpreter at start: free
import os
import sys

SOCKET_NAME = "control"
SHM_DIR = "/dev/shm"
SHM_MARKER = "dradriver-mps-standin"


def command() -> list[str]:
    """The command line that runs the stand-in (the driver's ``--mps-control-command`` on a simulated node).
    ``-S``: no ``site``, so no site-packages; the stand-in needs only the standard library."""
    return [sys.executable, "-S", os.path.abspath(__file__)]


def shm_marker(pid: int, shm: str = SHM_DIR) -> str:
    """The file the daemon of ``pid`` writes in its ``/dev/shm`` (``shm``: where another process sees that)."""
    return os.path.join(shm, f"{SHM_MARKER}.{pid}")


def _dirs() -> tuple[str, str]:
    return (
        os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
        os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
    )


def _serve() -> int:
    import time

    pipe, logs = _dirs()
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    os.chdir(pipe)  # a relative name: socket paths are limited to 108 bytes, state directories can be longer
    if os.path.lexists(SOCKET_NAME):
        os.unlink(SOCKET_NAME)
    server = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    server.bind(SOCKET_NAME)
    server.listen(8)
    log = open(os.path.join(logs, "control.log"), "a", buffering=1)  # noqa: SIM115 - open for the daemon's life
    log.write(f"[{time.time():.3f}] Startup pid={os.getpid()}\n")
    marker = _mark_shm(log)
    percentage = 100.0
    pinned: dict[str, str] = {}
    while True:
        fd, _ = server._accept()  # type: ignore[attr-defined]  # the C socket accepts as a descriptor
        with _Connection(fd) as conn:
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
                verb, args = words[0], words[1:]
                if verb == "quit":
                    quit_now = True
                elif verb == "get_server_list":
                    pass
                elif verb == "set_default_active_thread_percentage" and len(args) == 1:
                    percentage = float(args[0])
                    replies.append(f"{percentage:.1f}")
                elif verb == "get_default_active_thread_percentage":
                    replies.append(f"{percentage:.1f}")
                elif verb == "set_default_device_pinned_mem_limit" and len(args) == 2:
                    pinned[args[0]] = args[1]
                elif verb == "get_default_device_pinned_mem_limit" and len(args) == 1:
                    replies.append(pinned.get(args[0], "0M"))
                else:
                    replies.append(f"ERROR: unknown command {line.strip()!r}")
            if quit_now:
                # The socket goes before the answer: once the client returns, nothing answers in the directory.
                os.unlink(SOCKET_NAME)
                _remove(marker)
            conn.sendall(("\n".join(replies) + "\n").encode() if replies else b"")
        if quit_now:
            log.write(f"[{time.time():.3f}] Shutdown\n")
            log.close()
            return 0


def _mark_shm(log: io.TextIOWrapper) -> str:
    """Write the daemon's marker into its /dev/shm; its path."""
    import time

    marker = shm_marker(os.getpid())
    try:
        with open(marker, "w") as out:
            out.write(f"{os.getpid()}\n")
    except OSError as err:  # a /dev/shm it may not write to: the daemon serves on, and says so
        log.write(f"[{time.time():.3f}] cannot write {marker}: {err}\n")
    return marker


def _remove(path: str) -> None:
    import contextlib

    with contextlib.suppress(OSError):  # gone already (a /dev/shm emptied under it), or never written
        os.unlink(path)


def _client() -> int:
    pipe, _ = _dirs()
    client = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        os.chdir(pipe)
        client.connect(SOCKET_NAME)
    except OSError:
        client.close()
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with _Connection(client.detach()) as conn:
        conn.sendall(sys.stdin.read().encode())
        conn.shutdown(_socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    text = answer.decode()
    sys.stdout.write(text)
    return 1 if "ERROR" in text else 0


class _Connection(_socket.socket):
    """A connected socket from its descriptor, closed on leaving the ``with`` block."""

    def __init__(self, fd: int) -> None:
        super().__init__(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)

    def __enter__(self) -> "_Connection":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _background() -> int:
    import subprocess
    import time

    pipe, _ = _dirs()
    subprocess.Popen(
        [*command(), "-f"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(pipe, SOCKET_NAME)):
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
