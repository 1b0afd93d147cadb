#!/usr/bin/env bash
# Build (or reuse) the OCI registry the local cluster runs: distribution's `registry`, the
# reference implementation, built from its Go module like the Kubernetes components
# (hack/kube-binaries.sh). It does not depend on the Kubernetes release, so it is built once into
# $PATCHBAY_CACHE/tools/registry-<version>/registry, outside the repository, and never committed
# (hack/go-tool.sh). The build needs the network only for the Go module proxy.
#
# Usage: hack/registry-binary.sh            build if missing, then print the binary's path
#        hack/registry-binary.sh --print    print the path without building
# Kept apart from kube-binaries.sh so that adding it does not change that script's cache key
# (which would rebuild every cached Kubernetes release).
set -euo pipefail

REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.2}"
MOD=github.com/distribution/distribution/v3
# The version stamped the way distribution's Makefile does, so `registry --version` names it.
exec "$(dirname "$0")/go-tool.sh" registry "$REGISTRY_VERSION" "$MOD" "$MOD/cmd/registry" \
  "-X $MOD/version.version=$REGISTRY_VERSION -X $MOD/version.mainpkg=$MOD" "$@"
