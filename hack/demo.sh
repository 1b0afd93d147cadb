#!/usr/bin/env bash
# `make demo`: a local cluster with kwok nodes, then what Patchbay does on it.
# Grows with the project: the operator, example profiles and pods using them are added as the
# operator and agent land. Run `make demo-down` to stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES="${NODES:-10}"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "Starting the local cluster (control plane + kwok, $NODES fake nodes)"
kubeconfig=$(patchbay-devcluster up --nodes "$NODES" | tail -n 1)
export KUBECONFIG="$kubeconfig"

step "Nodes"
kubectl get nodes -L type

step "Done"
echo "KUBECONFIG=$KUBECONFIG"
echo "Stop everything with: make demo-down"
