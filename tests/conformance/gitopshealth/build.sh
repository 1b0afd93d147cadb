#!/usr/bin/env bash
# Build (or reuse) gitopshealth (main.go): Argo CD's Lua VM and Flux's kstatus, at the versions
# they ship with. gopher-lua v1.1.1 is the version argo-cd's go.mod requires (Argo CD 2.x and 3.x);
# cli-utils v0.37.2 is the kstatus release of the Kubernetes 1.34+ line. Prints the binary's path;
# `--cached-only`: exit 3 unless cached (hack/go-peer.sh).
set -euo pipefail
SRC="$(cd "$(dirname "$0")" && pwd)"
exec "$SRC/../../../hack/go-peer.sh" gitopshealth "$SRC" "$@" \
  github.com/yuin/gopher-lua@v1.1.1 sigs.k8s.io/cli-utils@v0.37.2
