#!/usr/bin/env bash
# Build (or reuse) one of the project's Go test peers: a `main` package in SRC_DIR (its *.go files)
# compiled against published Go modules, each pinned as MODULE@VERSION. Prints the binary's path.
# The one build script of every peer (tests/support/gopeer.py says which peer pins what).
#
#   hack/go-peer.sh NAME SRC_DIR [--cached-only] [--tags TAGS] [--kubernetes RELEASE]
#                   [--overlay PACKAGE=FILE] [MODULE@VERSION...]
#
# --tags TAGS: Go build tags (a peer's files for one library version or another).
# --kubernetes RELEASE: the peer imports k8s.io/kubernetes@RELEASE itself; its go.mod is made by
#   hack/k8s-wrapper-module.sh (the release's staging modules replaced by their published ones).
# --overlay PACKAGE=FILE: FILE (in SRC_DIR) is compiled into the imported PACKAGE as one more file
#   (`go build -overlay` on a vendor tree of what the peer needs; no upstream file is changed).
#
# Cache: $PATCHBAY_CACHE (default ~/.cache/patchbay)/NAME/<hash of SRC_DIR's files, the options,
# the pins and this script>/NAME; nothing is written into the repository. With --cached-only it
# builds nothing: it prints the path if the cache has the binary, else exits 3 (a cold build
# downloads and compiles its modules: seconds to many minutes). GOTOOLCHAIN=local: the machine's
# Go builds every peer.
set -euo pipefail

USAGE="usage: go-peer.sh NAME SRC_DIR [--cached-only] [--tags TAGS] [--kubernetes RELEASE] [--overlay PACKAGE=FILE] [MODULE@VERSION...]"
NAME="${1:?$USAGE}"
SRC="$(cd "${2:?$USAGE}" && pwd)"
shift 2
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHED_ONLY=0 TAGS="" KUBERNETES="" OVERLAY=""
while (( $# > 0 )); do
  case "$1" in
    --cached-only) CACHED_ONLY=1; shift ;;
    --tags) TAGS="${2:?$USAGE}"; shift 2 ;;
    --kubernetes) KUBERNETES="${2:?$USAGE}"; shift 2 ;;
    --overlay) OVERLAY="${2:?$USAGE}"; shift 2 ;;
    --*) echo "go-peer.sh: unknown option $1; $USAGE" >&2; exit 2 ;;
    *) break ;;
  esac
done
(( $# > 0 )) || [[ -n "$KUBERNETES" ]] || { echo "go-peer.sh: no MODULE@VERSION given" >&2; exit 2; }
CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY=$( { find "$SRC" -maxdepth 1 -type f | sort | xargs cat; cat "${BASH_SOURCE[0]}";
         [[ -z "$KUBERNETES" ]] || cat "$HACK/k8s-wrapper-module.sh";
         printf '%s\n' "tags=$TAGS" "kubernetes=$KUBERNETES" "overlay=$OVERLAY" "$@"; } | sha256sum | cut -c1-16)
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
if [[ -n "$KUBERNETES" ]]; then
  log "wrapper module for k8s.io/kubernetes@$KUBERNETES"
  "$HACK/k8s-wrapper-module.sh" "$OUT/mod" "patchbay.local/$NAME" "$KUBERNETES"
  go mod edit -require "k8s.io/kubernetes@$KUBERNETES"
else
  go mod init "patchbay.local/$NAME" >/dev/null 2>&1
fi
for pin in "$@"; do go mod edit -require "$pin"; done
log "resolving modules (${KUBERNETES:+k8s.io/kubernetes@$KUBERNETES }$*)"
go mod tidy >/dev/null
build=(go build -trimpath -ldflags "-s -w" ${TAGS:+-tags "$TAGS"})
if [[ -n "$OVERLAY" ]]; then
  # The overlay cannot touch files under GOMODCACHE, so the build uses a vendor tree (only the
  # packages the peer needs) and the overlay adds the one file there.
  pkg="${OVERLAY%%=*}" file="${OVERLAY#*=}"
  cp "$SRC/$file" "zz_patchbay_overlay.go.txt"
  go mod vendor
  pkgdir=$(go list -mod=vendor -f '{{.Dir}}' "$pkg")
  printf '{"Replace": {"%s/zz_patchbay_overlay.go": "%s/zz_patchbay_overlay.go.txt"}}\n' "$pkgdir" "$OUT/mod" > overlay.json
  build+=(-mod=vendor -overlay overlay.json)
fi
log "building"
"${build[@]}" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
log "built $BIN"
echo "$BIN"
