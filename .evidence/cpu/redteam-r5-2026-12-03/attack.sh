# usage: attack.sh NAME WHEN(step|teardown|before) [extra cmd...]
# env: PORT, STATE (VAST_HARNESS_HOME), MNT (tmpfs mount), CMD
set -u
hit() { if [ "${MODE:-ro}" = full ]; then dd if=/dev/zero of=$MNT/fill bs=1M 2>/dev/null; echo "filled at $(date -u +%T)" >> $OUT/events; else mount --bind $STATE $STATE && mount -o remount,bind,ro $STATE && echo "ro-bound at $(date -u +%T)" >> $OUT/events || echo "ro failed" >> $OUT/events; fi; }
NAME=$1; WHEN=$2
OUT=/tmp/r5/out-$NAME; mkdir -p $OUT
cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=${KEY:-k1} VAST_HARNESS_HOME=$STATE
[ "$WHEN" = before ] && mount -o remount,ro $MNT
date -u +%T > $OUT/start
uv run vast-e2e run --api-url http://127.0.0.1:$PORT --proof-interval 0.5 --max-minutes ${MAXMIN:-5} --max-usd 1 --workdir /tmp/r5/wd ${EXTRA:-} -- sh -c "${CMD:-echo hi; sleep 15; echo done}" > $OUT/stdout 2> $OUT/stderr &
PID=$!; echo $PID > $OUT/pid
if [ "$WHEN" = step ]; then
  until grep -q "^step run" $OUT/stderr 2>/dev/null; do sleep 0.2; kill -0 $PID 2>/dev/null || break; done
  sleep 2; hit
elif [ "$WHEN" = teardown ]; then
  until grep -q "tearing down" $OUT/stderr 2>/dev/null; do sleep 0.1; kill -0 $PID 2>/dev/null || break; done
  sleep ${TDELAY:-1}; hit
fi
wait $PID; echo "rc=$?" >> $OUT/events
date -u +%T > $OUT/end
