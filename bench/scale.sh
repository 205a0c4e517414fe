#!/usr/bin/env bash
# bench/scale.sh - startup and memory of idemd over a large embedded store.
#
#   bash bench/scale.sh ENGINE DIR N      ENGINE lmdb or rocksdb
#
# Preloads N completed records into DIR with idem-preload (sync=interval;
# skipped with SCALE_SKIP_PRELOAD=1 when DIR already holds them), drops the
# page cache when it may (root), starts idemd on the store with the
# engine's defaults, times exec to the first 200 of /readyz, then replays
# preloaded keys at random with wrk (bench/random-replay.lua, -c32,
# SCALE_SECONDS, default 60) while sampling idemd's RSS every second, and
# prints replays/s, p99, the peak RSS and idemd's VmHWM.  The numbers of
# issue 14 (10M records: /readyz within 2 s, RSS under 256 MiB) come from
#   bash bench/scale.sh lmdb /var/tmp/idem-10m 10000000
# IDEM_BUILD: the build directory [build].  DIR is left in place (it is
# large; remove it yourself).  Needs wrk and curl; not part of make test.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "scale.sh: $*" >&2; exit 2; }
[[ $# -eq 3 ]] || die "usage: bash bench/scale.sh lmdb|rocksdb DIR N"
engine=$1 dir=$2 n=$3
[[ $engine == lmdb || $engine == rocksdb ]] || die "engine must be lmdb or rocksdb, not $engine"
[[ $n =~ ^[1-9][0-9]{0,8}$ ]] || die "N must be a count from 1 to 999999999"
build=${IDEM_BUILD:-build}
case $build in /*) ;; *) build=$ROOT/$build ;; esac
secs=${SCALE_SECONDS:-60}
[[ $secs =~ ^[1-9][0-9]{0,3}$ ]] || die "SCALE_SECONDS must be 1..9999"
for tool in wrk curl python3; do command -v $tool >/dev/null || die "$tool is missing"; done
[[ -x $build/idemd && -x $build/bench/idem-preload ]] || die "no idemd or idem-preload in $build"

ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r port admin <<<"$ports"
log=$(mktemp)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -f "$log" "$log.wrk"; }
trap cleanup EXIT

echo "scale: $engine, $n records in $dir; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ ${SCALE_SKIP_PRELOAD:-0} != 1 ]]; then
  rm -rf "$dir"
  t0=$(date +%s.%N)
  "$build/bench/idem-preload" "$engine:$dir?sync=interval" "$n"
  t1=$(date +%s.%N)
  echo "scale: preloaded in $(python3 -c "print(round($t1-$t0,1))") s; on disk $(du -sh "$dir" | cut -f1)"
fi
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  echo "scale: page cache dropped"
else
  echo "scale: page cache kept (not root)"
fi
t0=$(date +%s.%N)
"$build/idemd" --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin" \
  --upstream http://127.0.0.1:9 --store "$engine:$dir" 2>"$log" &
pid=$!
until curl -sf -o /dev/null "http://127.0.0.1:$admin/readyz"; do
  kill -0 "$pid" 2>/dev/null || { tail -5 "$log"; die "idemd exited"; }
  sleep 0.01
done
t1=$(date +%s.%N)
echo "scale: exec to /readyz 200: $(python3 -c "print(round($t1-$t0,3))") s; RSS $(awk '/VmRSS/ {print $2, $3}' /proc/$pid/status)"
SCALE_N=$n wrk -t1 -c32 -d"${secs}s" --latency -s "$ROOT/bench/random-replay.lua" \
  "http://127.0.0.1:$port/" >"$log.wrk" &
w=$!
peak=0
while kill -0 "$w" 2>/dev/null; do
  r=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
  (( r > peak )) && peak=$r
  sleep 1
done
wait "$w" || true
grep -E "Requests/sec|^ +99%|Non-2xx" "$log.wrk" | sed 's/^/scale: /'
replays=$(curl -s "http://127.0.0.1:$admin/metrics" | awk '$1 ~ /^idem_requests_total/ && /outcome="replay"/ {s+=$2} END {print s+0}')
echo "scale: replays answered $replays; RSS peak $((peak / 1024)) MiB, $(grep VmHWM "/proc/$pid/status" | tr -s ' \t' ' ')"
