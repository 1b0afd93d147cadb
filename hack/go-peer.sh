#!/usr/bin/env bash
# Build (or reuse) one of the project's Go test peers: a `main` package in SRC_DIR (its *.go files)
# compiled against published Go modules, each pinned as MODULE@VERSION. Prints the binary's path.
#
#   hack/go-peer.sh NAME SRC_DIR [--cached-only] MODULE@VERSION...
#
# Cache: $PATCHBAY_CACHE (default ~/.cache/patchbay)/NAME/<hash of the sources, the pins and this
# script>/NAME; nothing is written into the repository. With --cached-only it builds nothing: it
# prints the path if the cache has the binary, else exits 3 (a cold build downloads and compiles
# its modules: seconds to minutes). GOTOOLCHAIN=local: the machine's Go builds every peer.
set -euo pipefail

NAME="${1:?usage: go-peer.sh NAME SRC_DIR [--cached-only] MODULE@VERSION...}"
SRC="$(cd "${2:?usage: go-peer.sh NAME SRC_DIR [--cached-only] MODULE@VERSION...}" && pwd)"
shift 2
CACHED_ONLY=0
if [[ "${1:-}" == "--cached-only" ]]; then CACHED_ONLY=1; shift; fi
(( $# > 0 )) || { echo "go-peer.sh: no MODULE@VERSION given" >&2; exit 2; }
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY=$( { cat "$SRC"/*.go "${BASH_SOURCE[0]}"; printf '%s\n' "$@"; } | sha256sum | cut -c1-16)
OUT="$CACHE/$NAME/$KEY"
BIN="$OUT/$NAME"
log() { printf '[%s %s] %s\n' "$NAME" "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
(( CACHED_ONLY )) && exit 3
command -v go >/dev/null || { log "ERROR: go is not installed"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN=local
rm -rf "$OUT/mod"
mkdir -p "$OUT/mod"
cd "$OUT/mod"
cp "$SRC"/*.go .
go mod init "patchbay.local/$NAME" >/dev/null 2>&1
for pin in "$@"; do go mod edit -require "$pin"; done
log "resolving modules ($*)"
go mod tidy >/dev/null
log "building"
go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
