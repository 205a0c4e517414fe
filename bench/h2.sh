#!/usr/bin/env bash
# bench/h2.sh - issue 23's HTTP/2 rows, apart from bench/run.sh for now:
# the same work over HTTP/1.1 and HTTP/2 with one client per pair of rows,
# so that only the protocol differs between a row and its pair.
#
# With h2load (Debian's nghttp2-client; `h2load --h1` for HTTP/1.1, which
# pipelines as deep as HTTP/2's streams are concurrent):
#   nginx-proxy-h1   h2load --h1 -> nginx proxy_pass (keep-alive pool) -> upstream
#   nginx-proxy-h2   h2load      -> nginx `listen ... http2` (h2c, prior knowledge)
#                                   proxy_pass -> the same upstream
#   idemd-replay-h1  h2load --h1 -> idemd (http2: true) : one completed key,
#                                   every request a replay
#   idemd-replay-h2  h2load      -> the same idemd over h2c
# With bench/h2keys.c (build/bench/idem-h2keys), which gives every request
# a key of its own (h2load sends the same header list on every request, so
# it cannot); --h1 pipelines the same way:
#   nginx-keys-h1    idem-h2keys --h1 -> nginx proxy_pass (nginx ignores the key)
#   nginx-keys-h2    idem-h2keys      -> nginx `listen ... http2`
#   idemd-new-h1     idem-h2keys --h1 -> idemd, a new key per request
#   idemd-new-h2     idem-h2keys      -> idemd over h2c, a new key per request
#
# idemd runs `--workers 1` on a fresh LMDB store with sync=interval (the
# CPU-bound new-key path of run.sh's idemd-new-interval).  Each row:
# BENCH_H2_SECONDS (5) after a 1 s warm-up, BENCH_H2_CLIENTS (32)
# connections of BENCH_H2_STREAMS (10) streams each, and the CPU (utime +
# stime, /proc) per request answered of the server process (nginx's proxy
# worker, idemd) and of the upstream's nginx worker.  The rows are measured
# BENCH_H2_ROUNDS (3) times, interleaved; the table gives each column's
# median over the rounds.  nginx runs two instances of one worker each: the
# upstream in the first, the proxies in a second, so that each worker's CPU
# is its own.  The proxies' keep-alive pool holds CLIENTS x STREAMS
# upstream connections: over HTTP/2 every stream is an upstream request at
# once, and a smaller pool (64) made nginx open and close upstream
# connections for the streams past it, a cost of the pool, not of HTTP/2.
#
# The verdict (issue 23's target): idemd's CPU per new key over HTTP/2 at
# most its CPU per new key over HTTP/1.1 plus nginx's HTTP/2 cost over its
# HTTP/1.1 cost, the nginx pair measured with the same client (nginx-keys).
#
# BENCH_H2_PERF=1: after the rounds, one more idemd-new-h2 run (not
# measured) under `perf record -g -p <idemd>`, and idemd's top symbols
# (self time) printed.
#
# Usage: IDEMD=build/idemd bench/h2.sh   (needs nginx, h2load and
#        build/bench/idem-h2keys; H2KEYS= names another one)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
IDEMD=${IDEMD:-$root/build/idemd}
SECS=${BENCH_H2_SECONDS:-5}
CLIENTS=${BENCH_H2_CLIENTS:-32}
STREAMS=${BENCH_H2_STREAMS:-10}
ROUNDS=${BENCH_H2_ROUNDS:-3}
PERF=${BENCH_H2_PERF:-0}
H2KEYS=${H2KEYS:-$root/build/bench/idem-h2keys}
[[ -x $H2KEYS ]] || { echo "h2.sh: no $H2KEYS (ninja -C build bench/idem-h2keys)" >&2; exit 1; }
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
nginx_conf "$WORK/px" "upstream pool { server 127.0.0.1:$UP; keepalive $((CLIENTS * STREAMS)); keepalive_requests 1000000; }
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
  --upstream "http://127.0.0.1:$UP" --store "lmdb:$WORK/store?sync=interval&map_size=4GiB" --workers 1 2>/dev/null &
IDEMD_PID=$!
PIDS+=("$IDEMD_PID")
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$IA/readyz" >/dev/null 2>&1 && curl -sf "http://127.0.0.1:$P2/" \
    --http2-prior-knowledge >/dev/null 2>&1 && break
  sleep 0.1
done
worker_of() { pgrep -P "$(cat "$WORK/$1/nginx.pid")" | head -1; }
PX_WORKER=$(worker_of px)
UP_WORKER=$(worker_of up)
KEY=bench-h2-replay
RUN=h2b$$-$(date +%s)
printf '{}' >"$WORK/body"
curl -sf -X POST -H "Idempotency-Key: $KEY" --data-binary @"$WORK/body" "http://127.0.0.1:$IP/pay" >/dev/null

ticks() { local s; s=$(cat "/proc/$1/stat"); s=${s##*) }; read -r -a f <<<"$s"; echo $((f[11] + f[12])); }
HZ=$(getconf CLK_TCK)
mkdir -p "$WORK/res"

# client h2load|h2keys h1|h2 SECS PORT TAG [h2load args]: one run; prints
# "DONE OK RPS" (requests answered, 2xx of them, req/s).
client() {
  local tool=$1 proto=$2 secs=$3 port=$4 tag=$5; shift 5
  local pa=() out
  if [[ $tool == h2load ]]; then
    [[ $proto == h1 ]] && pa=(--h1)
    out=$(h2load "${pa[@]}" -c "$CLIENTS" -m "$STREAMS" -D "$secs" "$@" "http://127.0.0.1:$port/pay" 2>&1) || true
    awk '/^requests:/ {d=$6} /^status codes:/ {gsub(",", "", $3); o=$3}
         /^finished in/ {gsub(",", "", $4); r=$4} END {printf "%d %d %.0f\n", d, o, r}' <<<"$out"
  else
    [[ $proto == h1 ]] && pa=(--h1)
    out=$("$H2KEYS" "${pa[@]}" -c "$CLIENTS" -m "$STREAMS" -d "$secs" -k "$RUN-$tag" -p /pay \
      127.0.0.1 "$port" 2>"$WORK/h2keys.err") || echo "h2.sh: $tag: not all 2xx: $(tail -1 "$WORK/h2keys.err")" >&2
    awk '/^completed/ {d=$2} /^status 2/ {o+=$3} /^req\/s/ {r=$2} END {printf "%d %d %.0f\n", d, o, r}' <<<"$out"
    awk -v t="$tag" '/^client-cpu/ {print "h2.sh: " t ": idem-h2keys " $2 " us/req"}' <<<"$out" >&2
  fi
}

# row NAME ROUND: one measured run of a row into $WORK/res/NAME.ROUND as
# "RPS OK DONE SERVER_US UPSTREAM_US".
declare -A SPEC
SPEC[nginx-proxy-h1]="h2load h1 $P1 px"
SPEC[nginx-proxy-h2]="h2load h2 $P2 px"
SPEC[idemd-replay-h1]="h2load h1 $IP idemd"
SPEC[idemd-replay-h2]="h2load h2 $IP idemd"
SPEC[nginx-keys-h1]="h2keys h1 $P1 px"
SPEC[nginx-keys-h2]="h2keys h2 $P2 px"
SPEC[idemd-new-h1]="h2keys h1 $IP idemd"
SPEC[idemd-new-h2]="h2keys h2 $IP idemd"
ROWS=(nginx-proxy-h1 nginx-proxy-h2 idemd-replay-h1 idemd-replay-h2
      nginx-keys-h1 nginx-keys-h2 idemd-new-h1 idemd-new-h2)
declare -A LABEL
LABEL[nginx-proxy-h1]="nginx proxy_pass, HTTP/1.1 (h2load)"
LABEL[nginx-proxy-h2]="nginx proxy_pass, HTTP/2 (h2load)"
LABEL[idemd-replay-h1]="idemd replay, HTTP/1.1 (h2load)"
LABEL[idemd-replay-h2]="idemd replay, HTTP/2 (h2load)"
LABEL[nginx-keys-h1]="nginx proxy_pass, HTTP/1.1 (h2keys)"
LABEL[nginx-keys-h2]="nginx proxy_pass, HTTP/2 (h2keys)"
LABEL[idemd-new-h1]="idemd new key, HTTP/1.1 (h2keys)"
LABEL[idemd-new-h2]="idemd new key, HTTP/2 (h2keys)"
row() {
  local name=$1 r=$2 tool proto port who pid extra=()
  read -r tool proto port who <<<"${SPEC[$name]}"
  if [[ $who == px ]]; then pid=$PX_WORKER; else pid=$IDEMD_PID; fi
  [[ $name == idemd-replay-* ]] && extra=(-H "Idempotency-Key: $KEY" -d "$WORK/body")
  client "$tool" "$proto" 1 "$port" "w$r-$name" "${extra[@]}" >/dev/null
  local s0 u0 s1 u1 done_n ok rps
  s0=$(ticks "$pid") u0=$(ticks "$UP_WORKER")
  read -r done_n ok rps < <(client "$tool" "$proto" "$SECS" "$port" "m$r-$name" "${extra[@]}")
  s1=$(ticks "$pid") u1=$(ticks "$UP_WORKER")
  awk -v s=$((s1 - s0)) -v u=$((u1 - u0)) -v hz="$HZ" -v n="$done_n" -v ok="$ok" -v r="$rps" \
    'BEGIN { printf "%s %d %d %.2f %.2f\n", r, ok, n, n ? s / hz * 1e6 / n : 0, n ? u / hz * 1e6 / n : 0 }' \
    >"$WORK/res/$name.$r"
  echo "h2.sh: round $r $name: $(cat "$WORK/res/$name.$r")" >&2
}

for r in $(seq "$ROUNDS"); do
  for name in "${ROWS[@]}"; do row "$name" "$r"; done
done

# median COLUMN NAME: the median of a column over the rounds.
median() {
  cat "$WORK/res/$2".* | awk -v c="$1" '{print $c}' | sort -g |
    awk '{v[NR]=$1} END {printf "%.1f", NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}
echo "h2load/idem-h2keys -c $CLIENTS -m $STREAMS, ${SECS}s a row, median of $ROUNDS interleaved rounds"
echo "| row | req/s | 2xx/done (all rounds) | server CPU us/req | upstream CPU us/req |"
echo "|---|---|---|---|---|"
for name in "${ROWS[@]}"; do
  ok=$(cat "$WORK/res/$name".* | awk '{o+=$2; d+=$3} END {printf "%d/%d", o, d}')
  printf '| %s | %.0f | %s | %s | %s |\n' "${LABEL[$name]}" "$(median 1 "$name")" "$ok" \
    "$(median 4 "$name")" "$(median 5 "$name")"
done
awk -v h1="$(median 4 idemd-new-h1)" -v h2="$(median 4 idemd-new-h2)" \
  -v n1="$(median 4 nginx-keys-h1)" -v n2="$(median 4 nginx-keys-h2)" 'BEGIN {
  lim = h1 + (n2 - n1)
  printf "target: idemd new key HTTP/2 %.1f us <= HTTP/1.1 %.1f + nginx (HTTP/2 %.1f - HTTP/1.1 %.1f) = %.1f us: %s\n",
    h2, h1, n2, n1, lim, h2 <= lim ? "MET" : "MISSED"
}'

if [[ $PERF == 1 ]]; then
  command -v perf >/dev/null || { echo "h2.sh: no perf" >&2; exit 1; }
  perf record -q -g -o "$WORK/perf.data" -p "$IDEMD_PID" 2>/dev/null &
  PERF_PID=$!
  sleep 0.5
  client h2keys h2 "$SECS" "$IP" perf >/dev/null
  kill -INT "$PERF_PID"; wait "$PERF_PID" 2>/dev/null || true
  echo "idemd during idemd-new-h2, perf record -g, self time by symbol:"
  perf report -i "$WORK/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null |
    grep -E '^ +[0-9]' | head -30 || true
  echo "self time by library:"
  perf report -i "$WORK/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null |
    grep -E '^ +[0-9]' | head -12 || true
fi
