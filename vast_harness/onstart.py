"""The onstart script Vast runs at boot: install the run's one-time SSH key, disable auto-tmux, arm the
dead-man switch.

The dead-man switch deletes *its own* instance with `CONTAINER_API_KEY` (which can only start, stop or destroy
that instance) once the time cap plus a grace has passed, so a harness that dies cannot leave a host billing
for long. The account key never goes to the host. Vast caps args + onstart at 4096 characters.
"""

from __future__ import annotations

import shlex

from vast_harness.errors import ConfigError

ONSTART_LIMIT_CHARS = 4096

_TEMPLATE = """\
touch ~/.no_auto_tmux
mkdir -p ~/.ssh && chmod 700 ~/.ssh
echo {pubkey} >> ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
cat > ~/.vh-deadman.sh <<'VHEOF'
sleep {after_s}
u={api_url}/api/v0/instances/$CONTAINER_ID/
for i in 1 2 3 4 5 6 7 8 9 10; do
  if command -v curl >/dev/null; then
    curl -s -m 20 -X DELETE -H "Authorization: Bearer $CONTAINER_API_KEY" -H 'Content-Type: application/json' -d '{{}}' "$u" && break
  else
    python3 -c "import os,urllib.request as r;r.urlopen(r.Request('$u',data=b'{{}}',method='DELETE',headers={{'Authorization':'Bearer '+os.environ['CONTAINER_API_KEY'],'Content-Type':'application/json'}}),timeout=20)" && break
  fi
  sleep 30
done
VHEOF
nohup setsid bash ~/.vh-deadman.sh > ~/.vh-deadman.log 2>&1 < /dev/null &
echo "vh onstart done: dead-man switch armed for {after_s} s"
"""


def build_onstart(*, public_key: str, api_url: str, deadman_after_s: int) -> str:
    script = _TEMPLATE.format(
        pubkey=shlex.quote(public_key.strip()), api_url=shlex.quote(api_url.rstrip("/")), after_s=int(deadman_after_s)
    )
    if len(script) > ONSTART_LIMIT_CHARS:
        raise ConfigError(f"onstart is {len(script)} characters; Vast allows {ONSTART_LIMIT_CHARS}")
    return script
