#!/usr/bin/env bash
# Install Debian's chromium and chromedriver for tests/harness/test_report_browser.py (the HTML reports in a
# real headless browser, driven by Selenium from the dev group). Browser builds that tools download for
# themselves cannot be fetched here; Debian's packages can. Idempotent: both already answering is kept.
set -euo pipefail

log() { echo "install-chromium: $*" >&2; }

works() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
  && chromium --headless=new --no-sandbox --version >/dev/null 2>&1; }

if works; then
  log "already installed: $(chromium --version 2>/dev/null)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
log "installing chromium and chromium-driver with apt"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2
works || { log "chromium or chromedriver still missing after the install"; exit 1; }
log "installed: $(chromium --version 2>/dev/null)"
