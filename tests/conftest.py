"""Suite-wide set-up: subprocesses started by tests import this checkout's ``src``."""

import os
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")

# Tests that start `python -m dradriver …` as a real process must run this tree's code, whether or not the
# package is installed (and even if another copy is).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
