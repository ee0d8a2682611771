#!/usr/bin/env bash
# Start a throwaway OpenSSH server on loopback for tests/harness/test_openssh.py.
#
# The harness's SSH layer is tested against a paramiko fake in test_ssh.py; this server exists so that
# CI also proves it against the real sshd a rented host runs (auth, exec, SFTP via internal-sftp).
#
#   VH_TEST_SSHD_PORT  port on 127.0.0.1 (default 2222)
#   VH_TEST_SSHD_DIR   state dir (default /tmp/vh-sshd): host key, sshd_config, authorized_keys,
#                      sshd.pid, sshd.log, and `port`, which the test reads to find the server
#
# Idempotent: if our sshd is already running from this dir on this port, it prints the port and exits 0.
# Prints the port on stdout; everything else goes to stderr.
set -euo pipefail

PORT="${VH_TEST_SSHD_PORT:-2222}"
DIR="${VH_TEST_SSHD_DIR:-/tmp/vh-sshd}"
SSHD=/usr/sbin/sshd

log() { echo "start-sshd: $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

bash "$(dirname "$0")/apt-install.sh" "openssh-server:$SSHD"

mkdir -p "$DIR"
chmod 700 "$DIR"

# Already running? Our pid file names a live sshd and the port answers: nothing to do.
if [ -f "$DIR/sshd.pid" ] && kill -0 "$(cat "$DIR/sshd.pid")" 2>/dev/null && port_open "$PORT" \
   && [ "$(cat "$DIR/port" 2>/dev/null)" = "$PORT" ]; then
  log "already running (pid $(cat "$DIR/sshd.pid")) on 127.0.0.1:$PORT"
  echo "$PORT"
  exit 0
fi
if [ -f "$DIR/sshd.pid" ] && kill -0 "$(cat "$DIR/sshd.pid")" 2>/dev/null \
   && [ -f "$DIR/port" ] && [ "$(cat "$DIR/port")" != "$PORT" ]; then
  log "an sshd from $DIR already serves port $(cat "$DIR/port"); use that port or another VH_TEST_SSHD_DIR"
  exit 1
fi
if port_open "$PORT"; then
  log "127.0.0.1:$PORT is taken by something that is not our sshd; set VH_TEST_SSHD_PORT"
  exit 1
fi

[ -f "$DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C vh-test-host \
  -f "$DIR/ssh_host_ed25519_key"
touch "$DIR/authorized_keys"
chmod 600 "$DIR/authorized_keys" "$DIR/ssh_host_ed25519_key"

cat >"$DIR/sshd_config" <<EOF
# Written by .ci/start-sshd.sh: a loopback-only sshd for tests, key auth only.
ListenAddress 127.0.0.1:$PORT
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The state dir lives under /tmp; StrictModes would reject it.
StrictModes no
X11Forwarding no
PrintMotd no
Subsystem sftp internal-sftp
LogLevel VERBOSE
EOF

# Debian's sshd refuses to start without its privilege-separation directory (absent in containers).
[ "$(id -u)" -ne 0 ] || mkdir -p /run/sshd

"$SSHD" -t -f "$DIR/sshd_config"
rm -f "$DIR/port"
"$SSHD" -f "$DIR/sshd_config" -E "$DIR/sshd.log"

for _ in $(seq 50); do
  if port_open "$PORT"; then
    echo "$PORT" >"$DIR/port"
    log "sshd (pid $(cat "$DIR/sshd.pid" 2>/dev/null || echo '?')) listening on 127.0.0.1:$PORT"
    echo "$PORT"
    exit 0
  fi
  sleep 0.1
done
log "sshd did not open 127.0.0.1:$PORT within 5 s; see $DIR/sshd.log:"
tail -n 20 "$DIR/sshd.log" >&2 || true
exit 1
