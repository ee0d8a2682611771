set -u
OUT=/tmp/r5/out-reapstop; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=k9 VAST_HARNESS_HOME=/tmp/r5/home9
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes 5 --max-usd 1 --workdir /tmp/r5/wd -- sh -c 'echo hi; sleep 300' > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "^step run" $OUT/stderr 2>/dev/null; do sleep 0.2; done; sleep 1
PY=$(pgrep -P $PID | head -1); kill -9 $PY; wait $PID
uv run vast-e2e reap --api-url http://127.0.0.1:18801 --proof-interval 0.5 > $OUT/reap 2>&1 & R=$!
until grep -q "deleting instance" $OUT/reap 2>/dev/null; do sleep 0.05; done
RPY=$(pgrep -P $R | head -1); kill -STOP $RPY; echo "reap stopped $(date -u +%T)" > $OUT/events; sleep ${STOPS:-70}; kill -CONT $RPY
wait $R; echo "reap rc=$?" >> $OUT/events
