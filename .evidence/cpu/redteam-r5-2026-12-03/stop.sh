# usage: stop.sh NAME TRIGGER_REGEX DELAY_S STOP_S
set -u
NAME=$1; TRIG=$2; DELAY=$3; STOPS=$4
OUT=/tmp/r5/out-$NAME; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=${KEY:-k2} VAST_HARNESS_HOME=${STATE:-/tmp/r5/home2}
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes ${MAXMIN:-5} --max-usd 1 --workdir /tmp/r5/wd ${EXTRA:-} -- sh -c "${CMD:-echo hi; sleep 5; echo done}" > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "$TRIG" $OUT/stderr 2>/dev/null; do sleep 0.05; kill -0 $PID 2>/dev/null || break; done
sleep $DELAY
PY=$(pgrep -P $PID -f vast-e2e | head -1)
kill -STOP $PY; sleep 0.5; echo "stopped py=$PY state=$(ps -o stat= -p $PY) at $(date -u +%T.%N)" >> $OUT/events
sleep $STOPS
kill -CONT $PY; echo "cont at $(date -u +%T.%N)" >> $OUT/events
wait $PID; echo "rc=$?" >> $OUT/events; date -u +%T >> $OUT/events
