#!/usr/bin/env bash
# Usage: k8s-wrapper-module.sh DIR MODULE_NAME K8S_VERSION
# Make DIR a Go module that can depend on k8s.io/kubernetes@K8S_VERSION: k8s.io/kubernetes
# requires its staging modules at v0.0.0 through local replace directives, which do not apply to
# a dependent module, so DIR's go.mod replaces each staging module k8s.io/X the release REQUIRES
# with its published k8s.io/X v0.<minor>.<patch> (some staging modules, e.g. sample-cli-plugin,
# are never published and are not needed). The go directive matches the release's own.
# Used by hack/kube-binaries.sh and tests/conformance/peer/build.sh.
set -euo pipefail
dir="$1" name="$2" version="$3"
cd "$dir"
# The module's zip is needed later anyway: fail here, clearly, if the proxy refuses it.
if ! info=$(go mod download -json "k8s.io/kubernetes@$version"); then
  echo "ERROR: cannot download k8s.io/kubernetes@$version:" >&2
  echo "$info" | grep '"Error"' >&2 || true
  exit 1
fi
gomod=$(echo "$info" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f "$gomod" ]] || { echo "ERROR: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
minor=$(echo "$version" | cut -d. -f2)
patch=$(echo "$version" | cut -d. -f3)
go mod init "$name" >/dev/null 2>&1
go mod edit -go="$(sed -n 's/^go //p' "$gomod")"
awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&/=> \.\/staging/{print $1}' "$gomod" | sort -u > staging.txt
awk '/^require \(/{q=1;next} q&&/^\)/{q=0} q&&$2=="v0.0.0"{print $1}' "$gomod" | sort -u > required.txt
n=0
while read -r m; do
  go mod edit -replace "$m=$m@v0.$minor.$patch"
  n=$((n + 1))
done < <(comm -12 staging.txt required.txt)
rm -f staging.txt required.txt
echo "wrapper module $name: $n staging replaces at v0.$minor.$patch" >&2
