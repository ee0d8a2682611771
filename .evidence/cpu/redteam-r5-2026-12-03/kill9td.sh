set -u
OUT=/tmp/r5/out-kill9td; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=k8 VAST_HARNESS_HOME=/tmp/r5/home8
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes 5 --max-usd 1 --workdir /tmp/r5/wd -- sh -c 'echo hi' > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "delete_ack" /tmp/r5/home8/ledger.jsonl 2>/dev/null; do sleep 0.05; done
PY=$(pgrep -P $PID | head -1); kill -9 $PY; echo "killed $PY at $(date -u +%T.%N)" > $OUT/events
wait $PID; echo "rc=$?" >> $OUT/events
