#!/usr/bin/env bash
# Install rsync for the copy off a stopped instance (tests/harness/test_interruptible.py, tests/sim/test_bid_book.py):
# `vastai copy` runs rsync against the host's daemon, and so do the harness and the simulator's copy daemon.
# Without it those tests skip locally; in CI (CI=true) they fail. Idempotent: one already on PATH is kept.
set -euo pipefail

log() { echo "install-rsync: $*" >&2; }

if command -v rsync >/dev/null 2>&1; then
  log "already installed: $(rsync --version | head -n 1)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
log "installing rsync with apt"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends rsync >&2
command -v rsync >/dev/null 2>&1 || { log "rsync still missing after the install"; exit 1; }
log "installed: $(rsync --version | head -n 1)"
