#!/usr/bin/env bash
# Debian packages the real node needs: containerd, runc, the CNI loopback plugin, a static
# busybox (the test image's userland) and a C compiler (the pause binary). Idempotent: installs
# only what is missing, so a second run costs nothing.
set -euo pipefail
need=()
command -v containerd >/dev/null && command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/loopback ]] || need+=(containernetworking-plugins)
{ [[ -x /bin/busybox ]] && file -b /bin/busybox 2>/dev/null | grep -q 'statically linked'; } || need+=(busybox-static)
command -v file >/dev/null || need+=(file)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if (( ${#need[@]} == 0 )); then
  echo "[host-packages] present: containerd runc containernetworking-plugins busybox-static gcc"
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
echo "[host-packages] installed ${need[*]}"
