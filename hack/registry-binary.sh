#!/usr/bin/env bash
# Build (or reuse) the OCI registry the local cluster runs: distribution's `registry`, the
# reference implementation, built from its Go module like the Kubernetes components
# (hack/kube-binaries.sh). It does not depend on the Kubernetes release, so it is built once into
# $PATCHBAY_CACHE/tools/registry-<version>/registry, outside the repository, and never committed.
# The build needs the network only for the Go module proxy.
#
# Usage: hack/registry-binary.sh            build if missing, then print the binary's path
#        hack/registry-binary.sh --print    print the path without building
# Kept apart from kube-binaries.sh so that adding it does not change that script's cache key
# (which would rebuild every cached Kubernetes release).
set -euo pipefail

REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.2}"
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
DIR="$CACHE/tools/registry-$REGISTRY_VERSION"
BIN="$DIR/registry"
MOD=github.com/distribution/distribution/v3

log() { printf '[registry-binary %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ "${1:-}" == "--print" || -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "ERROR: no go on PATH: install Go 1.21 or newer"; exit 1; }
# The Go release the module needs: the host's when new enough, else fetched through GOTOOLCHAIN.
need=$(cd / && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.GoVersion}}' "$MOD@$REGISTRY_VERSION")
[[ "$need" == *.*.* ]] || need="$need.0"
host=$(GOTOOLCHAIN=local go version | awk '{print $3}'); host=${host#go}
if [[ "$(printf '%s\n' "$host" "$need" | sort -V | head -n1)" == "$need" ]]; then
  export GOTOOLCHAIN=local
else
  export GOTOOLCHAIN="go$need"
fi

start=$(date +%s)
mkdir -p "$DIR"
log "go install $MOD/cmd/registry@$REGISTRY_VERSION (a few minutes cold on 2 cores; cached afterwards)"
# Stripped and without DWARF, as the other builds (hack/kube-binaries.sh); the version is stamped
# the way distribution's Makefile does, so `registry --version` names it.
(cd "$DIR" && CGO_ENABLED=0 GOBIN="$DIR" GOFLAGS="-buildvcs=false -gcflags=all=-dwarf=false" GOGC="${GOGC:-400}" \
  go install -trimpath -ldflags "-s -w -X $MOD/version.version=$REGISTRY_VERSION -X $MOD/version.mainpkg=$MOD" \
  "$MOD/cmd/registry@$REGISTRY_VERSION")
[[ -x "$BIN" ]] || { log "ERROR: $BIN missing after the build"; exit 1; }
log "done in $(( $(date +%s) - start ))s: $("$BIN" --version)"
echo "$BIN"
