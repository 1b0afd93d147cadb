#!/usr/bin/env bash
# Build (or reuse) bench/drapeer: main.go against k8s.io/dynamic-resource-allocation at the newest
# Kubernetes release of the matrix (a published staging module, on the Go module proxy). Prints the binary's
# path. Cache: $PATCHBAY_CACHE (default ~/.cache/patchbay)/drapeer/<version>-<hash of main.go and
# this script>/drapeer; nothing is written into the repository. With --cached-only it builds
# nothing: it prints the path if the cache has the binary, else exits 3 (a cold build downloads
# and compiles client-go: minutes).
set -euo pipefail

# Always the newest release of the matrix (its DRA helper library), whatever release the cluster
# runs: the peer is a baseline for speed, not a test of a release. DRAPEER_K8S_VERSION overrides.
K8S_VERSION="${DRAPEER_K8S_VERSION:-$("$(dirname "$0")/../../hack/kube-binaries.sh" --newest)}"
STAGING="v0.${K8S_VERSION#v1.}"
SRC="$(cd "$(dirname "$0")" && pwd)"
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY=$(cat "$SRC/main.go" "$SRC/build.sh" | sha256sum | cut -c1-16)
OUT="$CACHE/drapeer/$K8S_VERSION-$KEY"
BIN="$OUT/drapeer"
log() { printf '[drapeer %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
[[ "${1:-}" == "--cached-only" ]] && exit 3
command -v go >/dev/null || { log "ERROR: go is not installed"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN=local
mkdir -p "$OUT/mod"
cd "$OUT/mod"
cp "$SRC/main.go" .
[[ -f go.mod ]] || go mod init patchbay.local/drapeer >/dev/null 2>&1
go mod edit -require "k8s.io/dynamic-resource-allocation@$STAGING" -require "k8s.io/api@$STAGING" \
  -require "k8s.io/apimachinery@$STAGING" -require "k8s.io/client-go@$STAGING"
log "resolving modules"
go mod tidy >/dev/null
log "building"
go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
