#!/usr/bin/env bash
# scripts/run.sh - `make run`: the demo upstream on 127.0.0.1:9000 and idemd
# in front of it on 127.0.0.1:8080 (admin on :8081) with an LMDB store in
# ./idem-data.  Shows one request and its replay, then serves until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

build/examples/demo-upstream --listen 127.0.0.1:9000 &
pids+=($!)
build/idemd --listen 127.0.0.1:8080 --admin 127.0.0.1:8081 --upstream http://127.0.0.1:9000 \
    --store lmdb:./idem-data &
pids+=($!)

for _ in $(seq 50); do
  curl -fs http://127.0.0.1:8081/healthz >/dev/null 2>&1 && break
  sleep 0.1
done

key="demo-$(date +%s)-$$"
cat <<MSG

idemd is listening on http://127.0.0.1:8080 in front of the demo upstream on :9000.
Send a payment twice with one key; the second answer is a replay:

  curl -i -X POST http://127.0.0.1:8080/payments -H 'Idempotency-Key: $key' -d '{"amount":100}'
  curl -i -X POST http://127.0.0.1:8080/payments -H 'Idempotency-Key: $key' -d '{"amount":100}'

MSG
for i in 1 2; do
  echo "--- request $i"
  curl -si -X POST http://127.0.0.1:8080/payments -H "Idempotency-Key: $key" -d '{"amount":100}'
  echo
done
echo
echo "(the second shows X-Idempotent-Replay: true and the same \"executions\": 1)"
echo "Serving until Ctrl-C. Admin: http://127.0.0.1:8081/metrics"
wait
