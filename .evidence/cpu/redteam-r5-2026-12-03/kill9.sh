set -u
OUT=/tmp/r5/out-kill9; mkdir -p $OUT; cd ${CLONE:-/tmp/r5-attack}
export VAST_API_KEY=k3 VAST_HARNESS_HOME=/tmp/r5/home3
uv run vast-e2e run --api-url http://127.0.0.1:18801 --proof-interval 0.5 --max-minutes ${MAXMIN:-3} --max-usd 1 --workdir /tmp/r5/wd -- sh -c 'echo hi; sleep 900; echo done' > $OUT/stdout 2> $OUT/stderr &
PID=$!
until grep -q "^step run" $OUT/stderr 2>/dev/null; do sleep 0.2; kill -0 $PID 2>/dev/null || break; done
sleep 3
# the harness python process: child of uv
PY=$(pgrep -P $PID | head -1); echo "uv=$PID py=$PY" > $OUT/events
kill -9 ${PY:-$PID}; kill -9 $PID 2>/dev/null; echo "killed at $(date -u +%T)" >> $OUT/events
