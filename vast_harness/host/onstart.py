"""The onstart script Vast runs at boot: install the run's one-time SSH key, disable auto-tmux, arm the
dead-man switch, and prove it armed.

The dead-man switch deletes *its own* instance with `CONTAINER_API_KEY` (which "can only start, stop, or
destroy that specific instance", and read it: docs `hello-world.mdx`, `docker-environment.mdx`).

* **Its deadline is on the host's clock.** The create carries the allowance in seconds (the time cap plus a
  grace, counted from create); the first onstart writes `host now + allowance` to `~/.vh-deadman.deadline`
  and a re-run (onstart "runs automatically on container startup": Vast FAQ) reuses the file. The user's
  clock never enters it, so a user clock an hour off cannot move it. The onstart cannot know how long the
  host took to start it, so that deadline is late by at most one boot; the harness tightens it at its first
  SSH (`deadman.py`: host now + what is left of the allowance by the harness's monotonic clock; never later).
* **It proves it can act.** Before sleeping it reads its instance with the container key through the same
  URL and path family it deletes with, and writes the answer (status, first bytes) to `~/.vh-deadman.armed`;
  the harness fails the run closed unless that is a 200 showing this instance.
* **It stops only when a read says the instance is gone**: after a 200 `success: true` or a 404 naming the
  instance missing (`not_found` / `no_such_instance`) it waits `DEADMAN_VERIFY_S` and reads the instance with the
  container key; only `{"instances": null}` (or `[]`) or a 404 `not_found` ends it. A row still there, or any
  other answer, means DELETE again. Anything else is retried with a capped backoff, forever (the host exists
  as long as the loop does; `curl -s` alone exits 0 on every status).
* **A kept host's idle deadline** (`vast-e2e up`): a second file, `~/.vh-deadman.idle`, that the harness
  moves later at each `exec` and `keep` (`deadman.push_idle`); the switch fires at the earlier of the two
  files, so the idle deadline can move later but never past the cap's. The onstart writes its first value
  (host now + `idle_after_s`) only for a kept host; a run never has one. A missing or odd idle file keeps the
  last good value. The switch writes its pid to `~/.vh-deadman.pid`: a later command checks it still runs.
* **It finds its variables**: an empty `CONTAINER_ID` / `CONTAINER_API_KEY` is read from `/proc/1/environ` (the
  container's first process) before the switch fails closed.
* **It cannot act while the container is stopped** (Vast stops instances at a $0 balance; storage bills until
  deletion): `vast-e2e reap` covers that case. A 401/403 (the key refused) or a 410
  `deprecated_endpoint` (Vast retired the v0 path family) is logged as `DEADMAN-BROKEN`: loud, never "gone".
  Every attempt is logged (time, verb, status, first bytes) to `~/.vh-deadman.log`, pulled into the evidence.

The account key never goes to the host. Vast caps args + onstart at 4096 characters.
"""

from __future__ import annotations

import re
import shlex

from vast_harness.errors import ConfigError
from vast_harness.vast.endpoints import ENDPOINT_PATHS

ONSTART_LIMIT_CHARS = 4096
DEADMAN_BACKOFF_FIRST_S = 2
DEADMAN_BACKOFF_MAX_S = 120
DEADMAN_SLEEP_MAX_S = 30  # the switch re-reads its deadline file this often (the harness may tighten it)
# Files on the host (under $HOME): the deadline (host epoch seconds), the arm probe's answer, the switch's log.
DEADLINE_FILE = ".vh-deadman.deadline"
ARMED_FILE = ".vh-deadman.armed"
LOG_FILE = ".vh-deadman.log"
IDLE_FILE = ".vh-deadman.idle"  # a kept host's idle deadline (host epoch seconds): pushed later by exec and keep
PID_FILE = ".vh-deadman.pid"  # the switch's own pid
# The arm probe retries a 429/5xx/no answer, and a 200 that does not show the instance yet (reads lag creates:
# Timings.real().read_lag_window_s is 30 s), this often, 2 s apart.
ARM_PROBE_ATTEMPTS = 20
# After a DELETE that says gone, the switch reads its instance this long later (the container is usually killed
# first): a row still there, or any other answer, means DELETE again (vast-cli re-checks with `instance_exist`).
DEADMAN_VERIFY_S = 30
# Where the container's own variables are when the onstart's environment lacks them (public startup scripts
# hydrate CONTAINER_* from here).
PID1_ENVIRON = "/proc/1/environ"

# Placeholders are @NAME@ (the script is full of shell and Python braces).
_TEMPLATE = """\
touch ~/.no_auto_tmux
mkdir -p ~/.ssh && chmod 700 ~/.ssh
echo @PUBKEY@ >> ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
[ -s ~/@DFILE@ ] || echo $(($(date +%s)+@ALLOW_S@)) > ~/@DFILE@
@IDLE_INIT@cat > ~/.vh-deadman.sh <<'VHEOF'
echo $$ > ~/@PFILE@
e() { tr '\\000' '\\n' < @ENVIRON@ 2>/dev/null | sed -n "s/^$1=//p" | head -n 1; }
[ -n "$CONTAINER_ID" ] || CONTAINER_ID=$(e CONTAINER_ID)
[ -n "$CONTAINER_API_KEY" ] || CONTAINER_API_KEY=$(e CONTAINER_API_KEY)
export CONTAINER_ID CONTAINER_API_KEY
f=~/@DFILE@
u=@API_URL@@INSTANCE_PATH@
o=~/.vh-deadman.out
q() {
  : > $o
  if command -v curl >/dev/null; then
    curl -s -o $o -w '%{http_code}' -m 20 -X $1 -H "Authorization: Bearer $CONTAINER_API_KEY" -H 'Content-Type: application/json' ${2:+-d "$2"} "$u"
  else
    python3 -c "
import os,sys,urllib.request as r,urllib.error as e
d=sys.argv[4].encode() if sys.argv[4] else None
q=r.Request(sys.argv[2],data=d,method=sys.argv[1],headers={'Authorization':'Bearer '+os.environ.get('CONTAINER_API_KEY',''),'Content-Type':'application/json'})
try:
 x=r.urlopen(q,timeout=20);c=x.status;b=x.read()
except e.HTTPError as h:
 c=h.code;b=h.read()
except Exception as h:
 c=0;b=repr(h).encode()
open(sys.argv[3],'wb').write(b);print(c)" $1 "$u" $o "$2"
  fi
}
say() {
  m="$(date +%s) $1 $2 $(head -c 200 $o | tr -d '\\n')"
  case "$2" in 401|403) m="$m DEADMAN-BROKEN: the container key was refused";; 410) m="$m DEADMAN-BROKEN: the endpoint answers 410 (deprecated?)";; esac
  echo "$m"
}
if [ -z "$CONTAINER_ID" ] || [ -z "$CONTAINER_API_KEY" ]; then
  echo "$(date +%s) ARM 0 DEADMAN-BROKEN: CONTAINER_ID or CONTAINER_API_KEY is empty"; echo 0 > ~/@AFILE@; exit 1
fi
i=0
while :; do
  c=$(q GET); say ARM $c; i=$((i+1))
  case "$c" in 200) grep -Eq '"id": *'"$CONTAINER_ID"'([^0-9]|$)' $o && break;; 401|403|404|410) break;; esac
  [ $i -ge @ARM_TRIES@ ] && break; sleep 2
done
w=missing; grep -Eq '"id": *'"$CONTAINER_ID"'([^0-9]|$)' $o && w=shows
{ echo $c; echo $w; head -c 1000 $o; } > ~/@AFILE@.t && mv ~/@AFILE@.t ~/@AFILE@
echo "$(date +%s) armed: deletes at host epoch $(cat $f) (never later; a missing or odd file keeps the last)"
n=$(date +%s); D0=$(cat $f 2>/dev/null); case "$D0" in ''|*[!0-9]*) D0=$((n+@ALLOW_S@));; esac
I0=
while :; do
  n=$(date +%s); D=$(cat $f 2>/dev/null); case "$D" in ''|*[!0-9]*) D=$D0;; esac
  [ "$D" -lt "$D0" ] && D0=$D; D=$D0
  I=$(cat ~/@IFILE@ 2>/dev/null); case "$I" in ''|*[!0-9]*) I=$I0;; esac; I0=$I
  [ -n "$I" ] && [ "$I" -lt "$D" ] && D=$I
  [ "$n" -ge "$D" ] && break
  s=$((D-n)); [ $s -gt @SLEEP_MAX@ ] && s=@SLEEP_MAX@; sleep $s
done
b=@BACKOFF_FIRST@
while :; do
  c=$(q DELETE '{}'); say DELETE $c; g=
  case "$c" in
    200) grep -Eq '"success": *true|no_such_instance' $o && g=1;;
    404) grep -Eq '"(not_found|no_such_instance)"' $o && g=1;;
  esac
  if [ -n "$g" ]; then
    sleep @VERIFY_S@; c=$(q GET); say VERIFY $c
    case "$c" in
      200) grep -Eq '"instances": *(null|\\[ *\\])' $o && exit 0;;
      404) grep -Eq '"(not_found|no_such_instance)"' $o && exit 0;;
    esac
  fi
  sleep $b; b=$((b*2)); [ $b -gt @BACKOFF_MAX@ ] && b=@BACKOFF_MAX@
done
VHEOF
nohup setsid bash ~/.vh-deadman.sh >> ~/@LFILE@ 2>&1 < /dev/null &
echo "vh onstart done: dead-man switch armed for host epoch $(cat ~/@DFILE@)"
"""


def build_onstart(*, public_key: str, api_url: str, deadman_after_s: int, verify_after_s: int = DEADMAN_VERIFY_S,
                  environ_path: str = PID1_ENVIRON, idle_after_s: int | None = None,
                  recheck_s: int = DEADMAN_SLEEP_MAX_S) -> str:
    """The onstart for a create: the switch fires `deadman_after_s` after the host first runs it (on the
    host's clock), however often onstart runs, unless the harness tightens it. `idle_after_s` (a kept host):
    the first idle deadline, that long after the host first runs it; the harness pushes it later. `recheck_s`:
    how often the switch re-reads its files at most (a kept host's idle deadline may move earlier than the
    wake-up the switch planned: it fires at most this late). `verify_after_s` and `environ_path` are seams for
    tests (a short re-read, a fake `/proc/1/environ`)."""
    if deadman_after_s < 0:
        raise ConfigError(f"the dead-man allowance must be >= 0 s, got {deadman_after_s}")
    if idle_after_s is not None and idle_after_s < 0:
        raise ConfigError(f"the idle allowance must be >= 0 s, got {idle_after_s}")
    idle_init = (f"[ -s ~/{IDLE_FILE} ] || echo $(($(date +%s)+{int(idle_after_s)})) > ~/{IDLE_FILE}\n"
                 if idle_after_s is not None else "")
    values = {"PUBKEY": shlex.quote(public_key.strip()), "API_URL": shlex.quote(api_url.rstrip("/")),
              "ALLOW_S": str(int(deadman_after_s)), "BACKOFF_FIRST": str(DEADMAN_BACKOFF_FIRST_S),
              "BACKOFF_MAX": str(DEADMAN_BACKOFF_MAX_S), "SLEEP_MAX": str(max(1, min(DEADMAN_SLEEP_MAX_S, int(recheck_s)))),
              "INSTANCE_PATH": ENDPOINT_PATHS["destroy_instance"].replace("{id}", "$CONTAINER_ID"), "DFILE": DEADLINE_FILE, "AFILE": ARMED_FILE, "LFILE": LOG_FILE, "ARM_TRIES": str(ARM_PROBE_ATTEMPTS),
              "VERIFY_S": str(int(verify_after_s)), "ENVIRON": shlex.quote(environ_path), "IDLE_INIT": idle_init,
              "IFILE": IDLE_FILE, "PFILE": PID_FILE}
    script = re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], _TEMPLATE)  # one pass: a key cannot inject
    if len(script) > ONSTART_LIMIT_CHARS:
        raise ConfigError(f"onstart is {len(script)} characters; Vast allows {ONSTART_LIMIT_CHARS}")
    return script
