#!/usr/bin/env bash
# Run the kind e2e suite: build the image, create a kind cluster with DRA and CDI on, install the simulated
# overlay (manifests/overlays/sim), then apply every example in examples/scenarios and check what its
# containers received; plus a rolling update of the driver while a pod holds a GPU, and dynamic MIG.
#
#   e2e/run-kind.sh [pytest args]        e.g. e2e/run-kind.sh -k one-gpu
#
# Environment: KIND_NODE_IMAGE (default kindest/node:v1.35.0), E2E_KEEP_CLUSTER=1 keeps the cluster for
# debugging, PYTHON (default: python3 with dradriver's test extras installed).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in docker kind kubectl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "e2e needs: ${missing[*]} (install them, or run the normal suite: pytest tests)" >&2
  exit 2
fi
exec "${PYTHON:-python3}" -m pytest e2e -v -p no:xdist "$@"
