#!/usr/bin/env bash
# Install Debian/Ubuntu packages with apt, only those missing: `bash .ci/apt-install.sh PKG[:COMMAND]...`.
# A package counts as present when its COMMAND (default: the package's name; an absolute path is checked as a
# file) answers, so a tool already on PATH from elsewhere is kept and a second run installs nothing. The missing
# ones go in one apt-get call (sudo when not root); a COMMAND still missing afterwards is exit 1.
#   bash .ci/apt-install.sh chromium chromium-driver:chromedriver rsync
set -euo pipefail

log() { echo "apt-install: $*" >&2; }

[ "$#" -gt 0 ] || { log "usage: apt-install.sh PKG[:COMMAND]..."; exit 2; }

present() {
  case "$1" in
    /*) [ -x "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

missing=()
for arg in "$@"; do
  pkg="${arg%%:*}"
  cmd="${arg#*:}"
  if present "$cmd"; then
    log "already installed: $pkg ($cmd)"
  else
    missing+=("$pkg")
  fi
done
[ "${#missing[@]}" -gt 0 ] || exit 0

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { log "not root and no sudo: install ${missing[*]} yourself"; exit 1; }
  SUDO="sudo"
fi
log "installing ${missing[*]} with apt"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
for arg in "$@"; do
  cmd="${arg#*:}"
  present "$cmd" || { log "${arg%%:*} installed but $cmd is still missing"; exit 1; }
done
log "installed: ${missing[*]}"
