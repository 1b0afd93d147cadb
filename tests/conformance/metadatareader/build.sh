#!/usr/bin/env bash
# Build (or reuse) the device metadata reader (main.go) against k8s.io/dynamic-resource-allocation
# of one Kubernetes release: `build.sh v1.37.1` (the library v0.37.1; releases before 1.36 have no
# device metadata API: exits 4). Prints the binary's path. Cache: $PATCHBAY_CACHE (default
# ~/.cache/patchbay)/metadatareader/<release>-<hash of the sources>/; nothing is written into the
# repository. With --cached-only it builds nothing: the path if cached, else exit 3.
set -euo pipefail

RELEASE="${1:?usage: build.sh <kubernetes release, e.g. v1.37.1> [--cached-only]}"
STAGING="v0.${RELEASE#v1.}"
MINOR="${RELEASE#v1.}"; MINOR="${MINOR%%.*}"
(( MINOR >= 36 )) || { echo "release $RELEASE has no device metadata API (from 1.36)" >&2; exit 4; }
CHECK="check_v036.go.in"
(( MINOR >= 37 )) && CHECK="check_v037.go.in"
SRC="$(cd "$(dirname "$0")" && pwd)"
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY=$(cat "$SRC/main.go" "$SRC/$CHECK" "$SRC/build.sh" | sha256sum | cut -c1-16)
OUT="$CACHE/metadatareader/$RELEASE-$KEY"
BIN="$OUT/metadatareader"
log() { printf '[metadatareader %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
[[ "${2:-}" == "--cached-only" ]] && exit 3
command -v go >/dev/null || { log "ERROR: go is not installed"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$OUT/mod"
cd "$OUT/mod"
cp "$SRC/main.go" .
cp "$SRC/$CHECK" check.go
[[ -f go.mod ]] || go mod init patchbay.local/metadatareader >/dev/null 2>&1
go mod edit -require "k8s.io/dynamic-resource-allocation@$STAGING" -require "k8s.io/apimachinery@$STAGING"
log "resolving modules (k8s.io/dynamic-resource-allocation $STAGING)"
go mod tidy >/dev/null
log "building"
go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
