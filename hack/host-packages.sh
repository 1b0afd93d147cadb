#!/usr/bin/env bash
# Debian packages the local cluster and the images need: runc, the CNI plugins
# (bridge, host-local, loopback: the real node's pod network), iproute2 and iptables (the pod
# network and the test that nothing leaves it), a static busybox (the test image's userland), a C
# compiler (the pause binary), podman and mmdebstrap (the project's images, built with no Docker
# engine and no registry), prometheus (promtool tests the chart's alerts; the e2e runs a real
# Prometheus on loopback: docs/operations.md#alerts), python3-venv (`make venv`: Debian's python3
# has no venv/ensurepip without it). Idempotent: installs only what is missing. Not containerd:
# bookworm's 1.6 cannot inject CDI devices, so hack/kube-binaries.sh builds a 2.x with the
# Kubernetes binaries. Not Go: bookworm's 1.19 cannot fetch the toolchain the build needs
# (hack/kube-binaries.sh says which).
set -euo pipefail
need=()
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/loopback ]] || need+=(containernetworking-plugins)
{ [[ -x /bin/busybox ]] && file -b /bin/busybox 2>/dev/null | grep -q 'statically linked'; } || need+=(busybox-static)
command -v file >/dev/null || need+=(file)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || need+=(iptables)
command -v podman >/dev/null || need+=(podman)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v promtool >/dev/null || need+=(prometheus)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if (( ${#need[@]} == 0 )); then
  echo "[host-packages] present: runc containernetworking-plugins busybox-static gcc iproute2 iptables podman mmdebstrap prometheus python3-venv"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "[host-packages] missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "[host-packages] installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Only the binaries are wanted: where systemd runs, the package starts a Prometheus service that
# listens on every interface; stop and disable it (the tests start their own, on loopback).
if [[ " ${need[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
echo "[host-packages] installed ${need[*]}"
