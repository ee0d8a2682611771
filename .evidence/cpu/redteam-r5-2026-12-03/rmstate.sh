set -u
OUT=/tmp/r5/out-rmstate; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=k10 VAST_HARNESS_HOME=/tmp/r5/home10
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes 5 --max-usd 1 --workdir /tmp/r5/wd -- sh -c 'echo hi; sleep 8; echo done' > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "^step run" $OUT/stderr 2>/dev/null; do sleep 0.2; done; sleep 2
rm -rf /tmp/r5/home10; echo "removed state at $(date -u +%T)" > $OUT/events
wait $PID; echo "rc=$?" >> $OUT/events
