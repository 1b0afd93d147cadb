#!/usr/bin/env bash
# Build (or reuse) one Go command from its module, into $PATCHBAY_CACHE/tools/<name>-<version>/,
# outside the repository, never committed: what hack/registry-binary.sh and hack/cosign-binary.sh
# share. The build needs the network only for the Go module proxy; a host Go older than the one
# the module needs fetches that one through GOTOOLCHAIN.
#
# Usage: hack/go-tool.sh NAME VERSION MODULE PACKAGE LDFLAGS [--print]
#   NAME      the binary's name (and the cache folder's: NAME-VERSION)
#   MODULE    the Go module, PACKAGE the command's package in it (MODULE/cmd/NAME)
#   LDFLAGS   -X flags stamping the version, added to "-s -w"
# Prints the binary's path; --print prints it without building.
set -euo pipefail

NAME=$1 VERSION=$2 MOD=$3 PKG=$4 LDFLAGS=$5
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
DIR="$CACHE/tools/$NAME-$VERSION"
BIN="$DIR/$NAME"

log() { printf '[%s-binary %s] %s\n' "$NAME" "$(date +%H:%M:%S)" "$*" >&2; }

if [[ "${6:-}" == "--print" || -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "ERROR: no go on PATH: install Go 1.21 or newer"; exit 1; }
# The Go release the module needs: the host's when new enough, else fetched through GOTOOLCHAIN.
need=$(cd / && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.GoVersion}}' "$MOD@$VERSION")
[[ "$need" == *.*.* ]] || need="$need.0"
host=$(GOTOOLCHAIN=local go version | awk '{print $3}'); host=${host#go}
if [[ "$(printf '%s\n' "$host" "$need" | sort -V | head -n1)" == "$need" ]]; then
  export GOTOOLCHAIN=local
else
  export GOTOOLCHAIN="go$need"
fi

start=$(date +%s)
mkdir -p "$DIR"
log "go install $PKG@$VERSION (minutes cold on 2 cores; cached afterwards)"
# Stripped and without DWARF, as the other builds (hack/kube-binaries.sh).
(cd "$DIR" && CGO_ENABLED=0 GOBIN="$DIR" GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false" GOGC="${GOGC:-400}" \
  go install -trimpath -ldflags "-s -w $LDFLAGS" "$PKG@$VERSION")
[[ -x "$BIN" ]] || { log "ERROR: $BIN missing after the build"; exit 1; }
log "done in $(( $(date +%s) - start ))s"
echo "$BIN"
