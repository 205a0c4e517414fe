#!/usr/bin/env bash
# bench/h2.sh - issue 23's HTTP/2 rows, apart from bench/run.sh for now:
# the same work over HTTP/1.1 and HTTP/2 with one client, h2load (Debian's
# nghttp2-client; `h2load --h1` for HTTP/1.1), so that only the protocol
# differs between a row and its pair.
#
#   nginx-proxy-h1   h2load --h1 -> nginx proxy_pass (keep-alive pool) -> upstream
#   nginx-proxy-h2   h2load      -> nginx `listen ... http2` (h2c, prior knowledge)
#                                   proxy_pass -> the same upstream
#   idemd-replay-h1  h2load --h1 -> idemd (http2: true) : one completed key,
#                                   every request a replay
#   idemd-replay-h2  h2load      -> the same idemd over h2c
#
# Each row: BENCH_H2_SECONDS (5) after a 1 s warm-up, BENCH_H2_CLIENTS (32)
# connections of BENCH_H2_STREAMS (10) streams each (HTTP/1.1: one request at
# a time per connection), and the CPU (utime + stime, /proc) of the server
# process (nginx's proxy worker, idemd) per request answered.  nginx runs
# two workers of one master here: the upstream's in the first instance, the
# proxies' in a second, so that each worker's CPU is its own.
#
# h2load sends the same header list on every request, so a row with a new
# key per request (as run.sh's wrk Lua script makes) cannot be made with it:
# the "new key" HTTP/2 row is not here (bench/README.md, "Issue 23").
#
# Usage: IDEMD=build/idemd bench/h2.sh   (needs nginx and h2load)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
IDEMD=${IDEMD:-$root/build/idemd}
SECS=${BENCH_H2_SECONDS:-5}
CLIENTS=${BENCH_H2_CLIENTS:-32}
STREAMS=${BENCH_H2_STREAMS:-10}
for t in nginx h2load curl; do command -v $t >/dev/null || { echo "h2.sh: no $t" >&2; exit 1; }; done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-h2bench.XXXXXX")
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP=$(port) P1=$(port) P2=$(port) IP=$(port) IA=$(port)

nginx_conf() { # DIR BODY
  mkdir -p "$1"
  cat >"$1/nginx.conf" <<EOF
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/cb; proxy_temp_path $1/px; fastcgi_temp_path $1/fc;
    uwsgi_temp_path $1/uw; scgi_temp_path $1/sc;
    keepalive_requests 1000000;
    $2
}
EOF
}
nginx_conf "$WORK/up" "server { listen 127.0.0.1:$UP; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
nginx_conf "$WORK/px" "upstream pool { server 127.0.0.1:$UP; keepalive 64; keepalive_requests 1000000; }
    server { listen 127.0.0.1:$P1; location / { proxy_pass http://pool; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }
    server { listen 127.0.0.1:$P2 http2; location / { proxy_pass http://pool; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
for d in up px; do
  nginx -p "$WORK/$d/" -c "$WORK/$d/nginx.conf" -e "$WORK/$d/error.log" -g 'daemon off;' &
  PIDS+=($!)
done
cat >"$WORK/idemd.yaml" <<EOF
http2: true
routes:
  - methods: [POST]
    path: /
    mode: required
EOF
"$IDEMD" --config "$WORK/idemd.yaml" --listen "127.0.0.1:$IP" --admin "127.0.0.1:$IA" \
  --upstream "http://127.0.0.1:$UP" --store "lmdb:$WORK/store" --workers 1 2>/dev/null &
IDEMD_PID=$!
PIDS+=("$IDEMD_PID")
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$IA/readyz" >/dev/null 2>&1 && curl -sf "http://127.0.0.1:$P2/" \
    --http2-prior-knowledge >/dev/null 2>&1 && break
  sleep 0.1
done
worker_of() { pgrep -P "$(cat "$WORK/$1/nginx.pid")" | head -1; }
PX_WORKER=$(worker_of px)
KEY=bench-h2-replay
printf '{}' >"$WORK/body"
curl -sf -X POST -H "Idempotency-Key: $KEY" --data-binary @"$WORK/body" "http://127.0.0.1:$IP/pay" >/dev/null

ticks() { local s; s=$(cat "/proc/$1/stat"); s=${s##*) }; read -r -a f <<<"$s"; echo $((f[11] + f[12])); }
HZ=$(getconf CLK_TCK)

row() { # NAME PID URL h1|h2 [h2load args]
  local name=$1 pid=$2 url=$3 proto=$4; shift 4
  local pa=()
  [[ $proto == h1 ]] && pa=(--h1)
  h2load "${pa[@]}" -c "$CLIENTS" -m "$STREAMS" -D 1 "$@" "$url" >/dev/null 2>&1 || true
  local t0 t1 out rps done_n
  t0=$(ticks "$pid")
  out=$(h2load "${pa[@]}" -c "$CLIENTS" -m "$STREAMS" -D "$SECS" "$@" "$url" 2>&1)
  t1=$(ticks "$pid")
  done_n=$(awk '/^requests:/ {print $6}' <<<"$out")
  rps=$(awk '/^finished in/ {gsub(",", "", $4); printf "%.0f", $4}' <<<"$out")
  local ok
  ok=$(awk '/^status codes:/ {gsub(",", "", $3); print $3}' <<<"$out")
  printf '| %-16s | %8s | %10s | %8.1f |\n' "$name" "$rps" "${ok}/${done_n}" \
    "$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$done_n" 'BEGIN { print n ? t / hz * 1e6 / n : 0 }')"
}

echo "| row | req/s | 2xx/done | server CPU us/req |"
echo "|---|---|---|---|"
row nginx-proxy-h1 "$PX_WORKER" "http://127.0.0.1:$P1/pay" h1
row nginx-proxy-h2 "$PX_WORKER" "http://127.0.0.1:$P2/pay" h2
row idemd-replay-h1 "$IDEMD_PID" "http://127.0.0.1:$IP/pay" h1 -H "Idempotency-Key: $KEY" -d "$WORK/body"
row idemd-replay-h2 "$IDEMD_PID" "http://127.0.0.1:$IP/pay" h2 -H "Idempotency-Key: $KEY" -d "$WORK/body"
