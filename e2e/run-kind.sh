#!/usr/bin/env bash
# Run the e2e suite on kind: README's "Try it on kind" makes the cluster (the chart installed with the sim preset,
# our image its only other value), then every example in examples/scenarios is applied and what its containers
# received checked; plus a rolling update of the driver while a pod holds a GPU, and dynamic MIG. Logs of the
# cluster are exported when a test fails (the path is printed); the cluster is deleted at the end.
#
#   e2e/run-kind.sh [pytest args]        e.g. e2e/run-kind.sh -k one-gpu
#
# Docker where its daemon answers, else podman (this machine's sandbox limits worked around where they bite:
# docs/development.md, "kind"). kind: $KIND, else on PATH, else scripts/build-kind's; the node image:
# $KIND_NODE_IMAGE, else scripts/build-kind's (run it first where no registry is reachable), else
# kindest/node:v1.35.0. E2E_KEEP_CLUSTER=1 keeps the cluster for debugging; PYTHON (default: .venv/bin/python if
# present, else python3, with dradriver's test extras installed).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
# One process: the scenarios share the cluster and its one simulated node.
E2E_BACKEND=kind exec "$python" -m pytest e2e -v -n 0 "$@"
