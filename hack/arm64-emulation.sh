#!/usr/bin/env bash
# qemu-user emulation of arm64 for the images' arm64 builds (`make images-arm64`, `make images`,
# `make release`) and for the test that runs the arm64 agent (`make test-arm64`): Debian's
# qemu-user-static and binfmt-support (and arch-test, which mmdebstrap needs for a foreign
# architecture), and the kernel's binfmt_misc entry qemu-aarch64 enabled
# (binfmt_misc mounted first where the host has not). The entry is registered with the F flag
# (Debian's default), so the emulator is found inside chroots and containers too. Idempotent:
# installs and registers only what is missing; `--check` only says whether it is ready.
set -euo pipefail
binfmt=/proc/sys/fs/binfmt_misc
entry=$binfmt/qemu-aarch64
ready() {
  [[ -r $entry ]] && [[ $(head -n1 "$entry") == enabled ]] && grep -q '^flags:.*F' "$entry" &&
    command -v arch-test >/dev/null
}
if ready; then
  echo "[arm64-emulation] ready: $entry ($(grep '^interpreter' "$entry"), flags $(grep '^flags' "$entry" | cut -d' ' -f2))"
  exit 0
fi
if [[ ${1:-} == --check ]]; then
  echo "[arm64-emulation] not ready: $entry is missing or disabled (run hack/arm64-emulation.sh)" >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "[arm64-emulation] needs root: apt-get install qemu-user-static binfmt-support arch-test, then mount binfmt_misc and update-binfmts --enable qemu-aarch64" >&2
  exit 1
fi
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
command -v arch-test >/dev/null || need+=(arch-test)
if (( ${#need[@]} > 0 )); then
  echo "[arm64-emulation] installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [[ ! -e $binfmt/register ]]; then
  mount -t binfmt_misc binfmt_misc "$binfmt"
fi
# The package registers its formats when installed; where binfmt_misc was not mounted then,
# they are imported now.
update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
if ! ready; then
  echo "[arm64-emulation] $entry is still not an enabled entry with the F flag:" >&2
  cat "$entry" >&2 2>/dev/null || ls "$binfmt" >&2
  exit 1
fi
echo "[arm64-emulation] registered: $entry ($(grep '^interpreter' "$entry"))"
