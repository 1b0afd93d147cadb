#!/usr/bin/env bash
# Build (or reuse) cosign, which `make release` signs the released images and chart with and the
# release tests verify them with: built from sigstore/cosign's Go module like the registry
# (hack/registry-binary.sh), once, into $PATCHBAY_CACHE/tools/cosign-<version>/cosign, outside the
# repository, never committed (hack/go-tool.sh). The build needs the network only for the Go
# module proxy; cold, it took 12.6 minutes on 2 shared cores (README.md).
#
# Usage: hack/cosign-binary.sh            build if missing, then print the binary's path
#        hack/cosign-binary.sh --print    print the path without building
set -euo pipefail

COSIGN_VERSION="${COSIGN_VERSION:-v3.1.3}"
MOD="github.com/sigstore/cosign/v${COSIGN_VERSION:1:1}"
# The version stamped the way cosign's Makefile does (sigs.k8s.io/release-utils), so that
# `cosign version` names it.
exec "$(dirname "$0")/go-tool.sh" cosign "$COSIGN_VERSION" "$MOD" "$MOD/cmd/cosign" \
  "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" "$@"
