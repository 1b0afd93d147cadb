#!/usr/bin/env bash
# Build (or reuse) the conformance peer: tests/conformance/peer/main.go linked against the
# upstream kubelet device manager of the newest Kubernetes release of the matrix. Prints the binary's path.
#
# Independent of the Makefile (the tests call it). The one addition to upstream code,
# devicemanager_export.go.in (an exported constructor and a read-only view of the endpoints), is
# compiled into the vendored devicemanager package with `go build -overlay`; no upstream file is
# changed. Cache: $PATCHBAY_CACHE (default
# ~/.cache/patchbay)/conformance-peer/<k8s version>-<hash of this directory's sources>/peer;
# nothing is written into the repository. The wrapper module comes from hack/k8s-wrapper-module.sh,
# as for hack/kube-binaries.sh.
set -euo pipefail

SRC="$(cd "$(dirname "$0")" && pwd)"
# The newest release of the matrix, whatever K8S_VERSION the rest of the run uses: the peer's
# export file reads that release's device manager internals (endpoints per socket path, v1.37).
# The older kubelets' device managers are exercised on the real node (tests/e2e, make test-matrix).
# CONFORMANCE_K8S_VERSION overrides.
K8S_VERSION="${CONFORMANCE_K8S_VERSION:-$("$SRC/../../../hack/kube-binaries.sh" --newest)}"
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY=$(cat "$SRC/main.go" "$SRC/devicemanager_export.go.in" "$SRC/build.sh" "$SRC/../../../hack/k8s-wrapper-module.sh" | sha256sum | cut -c1-16)
OUT="$CACHE/conformance-peer/$K8S_VERSION-$KEY"
BIN="$OUT/peer"

log() { printf '[conformance-peer %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "ERROR: go is not installed"; exit 1; }
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN=local
mod="$OUT/mod"
rm -rf "$mod"
mkdir -p "$mod"
cd "$mod"
cp "$SRC/main.go" .
cp "$SRC/devicemanager_export.go.in" zz_patchbay_peer_export.go.txt

log "wrapper module for k8s.io/kubernetes@$K8S_VERSION"
"$SRC/../../../hack/k8s-wrapper-module.sh" "$mod" patchbay.local/conformancepeer "$K8S_VERSION"
go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
log "resolving modules (the module cache from hack/kube-binaries.sh makes this quick)"
go mod tidy >/dev/null

# The overlay cannot touch files under GOMODCACHE, so the build uses a vendor tree (only the
# packages the peer needs) and the overlay adds the one file there.
go mod vendor
pkgdir=$(go list -mod=vendor -f '{{.Dir}}' k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
printf '{"Replace": {"%s/zz_patchbay_peer_export.go": "%s/zz_patchbay_peer_export.go.txt"}}\n' "$pkgdir" "$mod" > overlay.json

log "building (the kubelet's device manager and its dependencies; minutes when cold)"
go build -mod=vendor -overlay overlay.json -trimpath -ldflags "-s -w" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
