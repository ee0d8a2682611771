# usage: reaprace.sh NAME DELAY [reap flags]
set -u
NAME=$1; DELAY=$2; shift 2
OUT=/tmp/r5/out-$NAME; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=${KEY:-k6} VAST_HARNESS_HOME=${STATE:-/tmp/r5/home6}
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes 5 --max-usd 1 --workdir /tmp/r5/wd -- sh -c "echo hi" > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "tearing down" $OUT/stderr 2>/dev/null; do sleep 0.05; kill -0 $PID 2>/dev/null || break; done
sleep $DELAY
uv run vast-e2e reap --api-url http://127.0.0.1:18801 --proof-interval 0.5 "$@" > $OUT/reap1 2>&1 & R1=$!
uv run vast-e2e reap --api-url http://127.0.0.1:18801 --proof-interval 0.5 "$@" > $OUT/reap2 2>&1 & R2=$!
wait $R1; echo "reap1 rc=$?" >> $OUT/events; wait $R2; echo "reap2 rc=$?" >> $OUT/events
wait $PID; echo "run rc=$?" >> $OUT/events
