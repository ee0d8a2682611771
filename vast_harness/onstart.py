"""The onstart script Vast runs at boot: install the run's one-time SSH key, disable auto-tmux, arm the
dead-man switch.

The dead-man switch deletes *its own* instance with `CONTAINER_API_KEY` (which can only start, stop or destroy
that instance) at an absolute deadline (epoch seconds fixed at create: the time cap plus a grace), so a
harness that dies cannot leave a host billing for long, and a container restart that re-runs onstart does not
restart the clock. It stops only when the instance is gone: a 200 `success: true`, or a 404 naming the
instance as missing (`not_found` / `no_such_instance`). Anything else (429, 5xx, an odd body, no answer)
is retried with a capped exponential backoff, forever: the host exists as long as the loop does, and
`curl -s` alone exits 0 on every HTTP status. The account key never goes to the host. Vast caps
args + onstart at 4096 characters.
"""

from __future__ import annotations

import re
import shlex
import time

from vast_harness.errors import ConfigError

ONSTART_LIMIT_CHARS = 4096
DEADMAN_BACKOFF_FIRST_S = 2
DEADMAN_BACKOFF_MAX_S = 120

# Placeholders are @NAME@ (the script is full of shell and Python braces).
_TEMPLATE = """\
touch ~/.no_auto_tmux
mkdir -p ~/.ssh && chmod 700 ~/.ssh
echo @PUBKEY@ >> ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
cat > ~/.vh-deadman.sh <<'VHEOF'
D=@DEADLINE@
u=@API_URL@/api/v0/instances/$CONTAINER_ID/
o=~/.vh-deadman.out
n=$(date +%s); [ "$n" -lt $D ] && sleep $((D-n))
b=@BACKOFF_FIRST@
while :; do
  : > $o
  if command -v curl >/dev/null; then
    c=$(curl -s -o $o -w '%{http_code}' -m 20 -X DELETE -H "Authorization: Bearer $CONTAINER_API_KEY" -H 'Content-Type: application/json' -d '{}' "$u")
  else
    c=$(python3 -c "
import os,sys,urllib.request as r,urllib.error as e
q=r.Request(sys.argv[1],data=b'{}',method='DELETE',headers={'Authorization':'Bearer '+os.environ['CONTAINER_API_KEY'],'Content-Type':'application/json'})
try:
 x=r.urlopen(q,timeout=20);c=x.status;b=x.read()
except e.HTTPError as h:
 c=h.code;b=h.read()
except Exception as h:
 c=0;b=repr(h).encode()
open(sys.argv[2],'wb').write(b);print(c)" "$u" $o)
  fi
  echo "$(date +%s) DELETE $c $(head -c 200 $o)"
  case "$c" in
    200) grep -Eq '"success": *true|no_such_instance' $o && exit 0;;
    404) grep -Eq '"(not_found|no_such_instance)"' $o && exit 0;;
  esac
  sleep $b; b=$((b*2)); [ $b -gt @BACKOFF_MAX@ ] && b=@BACKOFF_MAX@
done
VHEOF
nohup setsid bash ~/.vh-deadman.sh >> ~/.vh-deadman.log 2>&1 < /dev/null &
echo "vh onstart done: dead-man switch armed for epoch @DEADLINE@"
"""


def build_onstart(*, public_key: str, api_url: str, deadman_after_s: int, now_s: float | None = None) -> str:
    """The onstart for a create happening now (`now_s`, default the wall clock): the switch fires at
    `now_s + deadman_after_s` in epoch seconds, however often onstart runs."""
    deadline_s = int((time.time() if now_s is None else now_s) + deadman_after_s)
    values = {"PUBKEY": shlex.quote(public_key.strip()), "API_URL": shlex.quote(api_url.rstrip("/")),
              "DEADLINE": str(deadline_s), "BACKOFF_FIRST": str(DEADMAN_BACKOFF_FIRST_S),
              "BACKOFF_MAX": str(DEADMAN_BACKOFF_MAX_S)}
    script = re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], _TEMPLATE)  # one pass: a key cannot inject
    if len(script) > ONSTART_LIMIT_CHARS:
        raise ConfigError(f"onstart is {len(script)} characters; Vast allows {ONSTART_LIMIT_CHARS}")
    return script
