#!/usr/bin/env bash
# Build (or reuse) the real Kubernetes components that the local cluster, the tests and the demo
# run: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl (all from
# ONE pinned Kubernetes release, built from the Go module proxy), plus kwok, helm and the real
# node's containerd (2.x: it injects CDI devices, which Debian bookworm's containerd 1.6 cannot).
#
# Why build from Go modules: this machine reaches only package registries, so release tarballs
# and container images cannot be downloaded. k8s.io/kubernetes depends on its staging modules at
# v0.0.0 through local replace directives, so a wrapper module replaces each staging module with
# its published v0.<minor>.<patch> tag, generated from the release's own go.mod.
#
# Releases: K8S_VERSION picks one of the support matrix (hack/kube-releases, the one definition:
# one release per line, the newest, the default, last). `--matrix` prints the matrix; `--oldest`
# and `--newest` print one release. v1.37.2 exists on the proxy but its source zip is refused
# (403), so the newest is 1.37.1.
# Cache: $PATCHBAY_CACHE (default ~/.cache/patchbay)/kube/<key>/bin per release, for the
# Kubernetes binaries only; etcd, kwok, helm and containerd do not depend on the release, so they
# are built once into $CACHE/tools/<name>-<version>/ and linked into each release's bin dir. A
# stamp file makes a second run a no-op in well under a second.
#
# Go: the build needs the highest `go` line of the pinned modules' go.mod files (k8s.io/kubernetes
# at K8S_VERSION, etcd, containerd, kwok, helm). A host Go at least that new builds them as it is
# (GOTOOLCHAIN=local); an older one (1.21 or later) is told GOTOOLCHAIN=go<that version>, so the go
# command fetches that release from the module proxy into the module cache, once, and builds with
# it. `--toolchain` prints the choice without building. The cache keys do not name the Go release:
# any release that the modules accept builds the same programs.
set -euo pipefail

HACK="$(cd "$(dirname "$0")" && pwd)"
RELEASES_FILE="$HACK/kube-releases"
releases() { grep -Ev '^\s*(#|$)' "$RELEASES_FILE"; }
case "${1:-}" in
  --matrix) releases; exit 0 ;;
  --oldest) releases | head -n1; exit 0 ;;
  --newest) releases | tail -n1; exit 0 ;;
esac

K8S_VERSION="${K8S_VERSION:-$(releases | tail -n1)}"
if ! releases | grep -qxF "$K8S_VERSION"; then
  echo "[kube-binaries] WARNING: K8S_VERSION=$K8S_VERSION is not in the support matrix ($(releases | tr '\n' ' ')); building it anyway" >&2
fi
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v4.3.1}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"

CACHE="${PATCHBAY_CACHE:-$HOME/.cache/patchbay}"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_containerd-${CONTAINERD_VERSION}"
OUT="$CACHE/kube/$KEY"
BIN="$OUT/bin"
STAMP="$OUT/.complete"
TOOLS="$CACHE/tools"

log() { printf '[kube-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN"
  exit 0
fi

# --- the Go toolchain: the host's, or the release of Go the pinned modules need ------------------
GO_MIN_SWITCH=1.21.0  # the first Go that fetches other toolchains (GOTOOLCHAIN)
MODULES=("k8s.io/kubernetes@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" "sigs.k8s.io/kwok@$KWOK_VERSION"
  "helm.sh/helm/v4@$HELM_VERSION")
# true if version $1 is older than version $2 (1.26.0 < 1.26.6 < 1.27.0)
older() { [[ "$1" != "$2" && "$(printf '%s\n' "$1" "$2" | sort -V | head -n1)" == "$1" ]]; }
# Sets GOTOOLCHAIN for the build, or stops with one line that says what to do.
choose_toolchain() {
  command -v go >/dev/null || {
    log "ERROR: no go on PATH: install Go $GO_MIN_SWITCH or newer (Debian 12's golang-go is 1.19, too old); it fetches the Go release the build needs itself"
    exit 1
  }
  local host need=0 mod line go
  host=$(GOTOOLCHAIN=local go version | awk '{print $3}')  # go version go1.26.8 linux/amd64
  host=${host#go}
  # Each module's `go` line, from the module cache or the proxy (its go.mod only, outside any module).
  for mod in "${MODULES[@]}"; do
    if ! line=$(cd / && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.GoVersion}}' "$mod"); then
      if older "$host" "$GO_MIN_SWITCH"; then
        log "ERROR: the host's go$host is too old: install Go $GO_MIN_SWITCH or newer"
      else
        log "ERROR: cannot read the go.mod of $mod from the Go module proxy (above: go's own words)"
      fi
      exit 1
    fi
    [[ "$line" == *.*.* ]] || line="$line.0"  # `go 1.22` is the language; its first release is go1.22.0
    if [[ "$need" == 0 ]] || older "$need" "$line"; then need=$line go=$mod; fi
  done
  if ! older "$host" "$need"; then
    export GOTOOLCHAIN=local
    log "Go: the host's go$host (the pinned modules need go$need, $go)"
  elif older "$host" "$GO_MIN_SWITCH"; then
    log "ERROR: the host's go$host is older than the go$need that $go needs, and too old to fetch it: install Go $GO_MIN_SWITCH or newer"
    exit 1
  else
    export GOTOOLCHAIN="go$need"
    log "Go: the host's go$host is older than the go$need that $go needs: building with GOTOOLCHAIN=go$need (fetched from the Go module proxy into the module cache, once)"
  fi
}

if [[ "${1:-}" == "--toolchain" ]]; then
  choose_toolchain
  echo "$GOTOOLCHAIN"
  exit 0
fi

if [[ -f "$STAMP" ]]; then
  log "cached: $BIN ($KEY)"
  exit 0
fi

choose_toolchain
mkdir -p "$BIN" "$OUT/work"
start=$(date +%s)
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

have() { [[ -x "$BIN/$1" ]]; }

# --- Kubernetes (one wrapper module for every component of the release) ------------------------
k8s_build() {
  local mod="$OUT/work/k8s"
  mkdir -p "$mod"
  cd "$mod"
  if [[ ! -f go.mod ]]; then
    log "resolving k8s.io/kubernetes@$K8S_VERSION"
    "$HACK/k8s-wrapper-module.sh" "$mod" patchbay.local/kubebuild "$K8S_VERSION"
  fi
  local pkgs=(cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl)
  local tools=()
  for p in "${pkgs[@]}"; do tools+=("k8s.io/kubernetes/$p@$K8S_VERSION"); done
  if ! grep -q '^tool' go.mod; then
    log "go get -tool (downloads the module graph; the slow part of a cold run)"
    go get -tool "${tools[@]}"
  fi
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  local static=()
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    have "$c" || static+=("k8s.io/kubernetes/cmd/$c")
  done
  if (( ${#static[@]} )); then
    log "building ${static[*]##*/} (CGO_ENABLED=0)"
    CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$BIN/" "${static[@]}"
  fi
  if ! have kubelet; then
    log "building kubelet (cgo)"
    CGO_ENABLED=1 go build -trimpath -ldflags "$ld" -o "$BIN/" k8s.io/kubernetes/cmd/kubelet
  fi
}

# --- etcd: its server module has replace directives, so it too needs a wrapper module ----------
etcd_build() {
  local dir="$TOOLS/etcd-$ETCD_VERSION"
  [[ -x "$dir/etcd" ]] && return 0
  local mod="$dir/work"
  mkdir -p "$mod"
  cd "$mod"
  [[ -f go.mod ]] || go mod init patchbay.local/etcdbuild >/dev/null 2>&1
  grep -q '^tool' go.mod || { log "go get -tool go.etcd.io/etcd/server/v3@$ETCD_VERSION"; go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"; }
  log "building etcd $ETCD_VERSION"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/etcd" go.etcd.io/etcd/server/v3
}

# --- containerd, its runc shim and ctr: a wrapper module as for etcd -----------------------------
# Build tags leave out the snapshotters that need C headers or kernel features the node never uses.
containerd_build() {
  local dir="$TOOLS/containerd-$CONTAINERD_VERSION"
  [[ -f "$dir/.complete" ]] && return 0
  local mod="$dir/work" m=github.com/containerd/containerd/v2
  mkdir -p "$mod"
  cd "$mod"
  [[ -f go.mod ]] || go mod init patchbay.local/containerdbuild >/dev/null 2>&1
  if ! grep -q '^tool' go.mod; then
    log "go get -tool $m@$CONTAINERD_VERSION"
    go get -tool "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
      "$m/cmd/ctr@$CONTAINERD_VERSION"
  fi
  log "building containerd $CONTAINERD_VERSION (containerd, containerd-shim-runc-v2, ctr)"
  CGO_ENABLED=1 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION" \
    -o "$dir/" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
  touch "$dir/.complete"
}

# --- kwok and helm install with plain `go install` ----------------------------------------------
goinstall() {
  local name="$1" pkg="$2" dir="$TOOLS/$1-${2##*@}"
  [[ -x "$dir/$name" ]] && return 0
  log "go install $pkg"
  mkdir -p "$dir"
  (cd "$dir" && GOFLAGS="$GOFLAGS -buildvcs=false" CGO_ENABLED=0 GOBIN="$dir" go install -trimpath -ldflags "-s -w" "$pkg")
}

# The release-independent tools, linked into the release's bin dir (one PATH entry for all).
link_tools() {
  ln -sfn "$TOOLS/etcd-$ETCD_VERSION/etcd" "$BIN/etcd"
  for b in containerd containerd-shim-runc-v2 ctr; do
    ln -sfn "$TOOLS/containerd-$CONTAINERD_VERSION/$b" "$BIN/$b"
  done
  ln -sfn "$TOOLS/kwok-$KWOK_VERSION/kwok" "$BIN/kwok"
  ln -sfn "$TOOLS/helm-$HELM_VERSION/helm" "$BIN/helm"
}

# Two settings that make a cold build about a tenth faster (docs/compatibility.md#builds) without
# changing what the programs do: they are stripped (-s -w), so the DWARF the compiler would write
# is thrown away at link anyway (the instructions stay the same; data moves in the layout); a
# higher GOGC lets the compiler collect its heap less often (the output is the same byte for byte).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-gcflags=all=-dwarf=false"
export GOGC="${GOGC:-400}"
log "cold build into $BIN (tens of minutes on 2 cores; cached afterwards)"
# go build is silent for minutes at a time: a heartbeat shows the build is alive.
( while sleep 60; do log "... still building ($(( $(date +%s) - start ))s elapsed)"; done ) &
heartbeat=$!
trap 'kill $heartbeat 2>/dev/null || true' EXIT
etcd_build
k8s_build
containerd_build
goinstall kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
goinstall helm "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
link_tools

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kwok helm \
  containerd containerd-shim-runc-v2 ctr; do
  have "$b" || { log "ERROR: $b missing after build"; exit 1; }
done
"$BIN/kube-apiserver" --version >&2
touch "$STAMP"
log "done in $(( $(date +%s) - start ))s: $BIN"
