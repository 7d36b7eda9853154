"""Runs a KubeletPlugin with the fake handler as a real process, the way `dradriver run` will.

Usage: python tests/support/kubelet_plugin_process.py REGISTRY_DIR PLUGIN_DIR CLAIMS_JSON
Prints "ready" once both sockets serve; SIGTERM stops it (registration socket first). A refused start prints
the error on stderr and exits 2, like the CLI.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

from kubelet_plugin_fakes import DRIVER, FakeClaimSource, FakeHandler

from dradriver.errors import DradriverError
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions


def main() -> int:
    registry_dir, plugin_dir, claims_file = (Path(arg) for arg in sys.argv[1:4])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    plugin = KubeletPlugin(
        KubeletPluginOptions(
            driver_name=DRIVER, node_name="node-a", registry_dir=registry_dir, plugin_dir=plugin_dir, stop_grace=5.0
        ),
        handler=FakeHandler(),
        claim_source=FakeClaimSource(json.loads(claims_file.read_text())),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        plugin.start()
    except DradriverError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("ready", flush=True)
    try:
        stop.wait()
    finally:
        plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
