#!/usr/bin/env bash
# bench/run.sh - `make bench`: idemd against nginx, in one run, with wrk.
#
# Rows, in this order (bench/README.md explains each):
#   nginx-direct        wrk -> nginx "upstream" server (a fixed JSON 200)
#   nginx-proxy         wrk -> nginx proxy_pass (keep-alive pool) -> upstream
#   idemd-new-always    wrk -> idemd -> upstream, a fresh key per request,
#                       LMDB sync=always, store preloaded with BENCH_PRELOAD keys
#   idemd-new-interval  the same with sync=interval (its own copy of the store)
#   idemd-replay        wrk -> idemd, one completed key: every request a replay
#   idemd-new-redis     new keys, on a Redis server started here (no persistence:
#                       the default of Debian's redis-server is RDB snapshots,
#                       which cost nothing per request either)
#   idemd-replay-redis  replays on Redis (local_cache off: each one a store call)
#   idemd-new-pg        new keys, on a PostgreSQL cluster started here
#                       (synchronous_commit on, fsync on: every batch is a WAL flush)
#   idemd-replay-pg     replays on PostgreSQL (local_cache off)
#   idemd-new-rediss    new keys, on a Redis of its own over TLS (rediss://,
#                       --tls-port, the run's certificates, no client certificates)
#   idemd-new-redis-cluster  new keys, on a Redis Cluster of 3 masters and NO
#                       replicas (tests/cluster.py), redis+cluster:// with the
#                       three masters as seeds.  This is the row compared with
#                       idemd-new-redis (issue 20: "the cluster row's req/s at
#                       least that of one Redis master"): like for like, every
#                       Redis of both rows is a master without a replica, so
#                       the comparison measures sharding, not replication.
#   idemd-new-redis-cluster-replicas  the same with a replica per master (3
#                       masters + 3 replicas, the deployment issue 20's tests
#                       use): what replication costs, on the masters (feeding
#                       the replication stream) and on the replicas (applying
#                       it), shown apart ("masters" and "replicas" in the
#                       JSON) and never held to the one-master target.
#   The Redis and PostgreSQL rows are skipped with BENCH_SERVER_STORES=0; their
#   stores are preloaded with BENCH_PRELOAD_SERVER keys.  The Redis rows also
#   record the CPU of their Redis server processes ("store": the one server,
#   or every node of the cluster, replicas included).
#   express-new         wrk -> Node.js Express app with the express-idempotency
#                       middleware (bench/express/app.js) -> the same upstream,
#                       a fresh key per request
#   express-replay      the same app, one completed key: every request a replay
#   idemd-workers-1     new keys, LMDB sync=interval on a fresh store, --workers 1
#   idemd-workers-auto  the same with --workers auto (one per CPU: issue 22)
#   The express rows are skipped with BENCH_EXPRESS=0; bench/express's
#   dependencies are installed there with `npm ci` when missing.
#   nginx-tls-listener  wrk https -> a second nginx (bench/nginx-front.conf.in,
#                       its own worker) `listen ssl` -> proxy_pass (keep-alive
#                       pool) -> the plain upstream
#   idemd-tls-listener  wrk https -> idemd listen_tls (the same certificate) ->
#                       the plain upstream, a fresh key per request, sync=interval
#                       (its own copy of the preloaded store)
#   nginx-https-upstream  wrk http -> the second nginx -> proxy_pass https://
#                       (keep-alive pool, proxy_ssl_session_reuse on, the
#                       certificate verified) -> nginx's TLS upstream server
#   idemd-https-upstream  wrk http -> idemd with `upstream: https://` and
#                       upstream_tls.ca_file -> the same TLS upstream, a fresh key
#                       per request, sync=interval (its own store copy).  Skipped,
#                       with a note, when idemd refuses the configuration (-t) or
#                       does not answer 200 through it (a build without https
#                       upstreams).
#   tls-handshakes      not a wrk row: BENCH_HS_CLIENTS `openssl s_time -new`
#                       clients for BENCH_HS_SECONDS against the second nginx's
#                       TLS listener and against idemd's listen_tls, a new
#                       TLS connection (a full handshake) each time; handshakes
#                       a second and the server's CPU per handshake.
#   Each TLS row's client uses keep-alive connections: wrk's rows measure the
#   record encryption, tls-handshakes the handshakes.  Certificates (a CA and
#   a server certificate for localhost and 127.0.0.1, EC P-256) are made per
#   run by tests/certs.py.
# Every wrk row also records the CPU (utime + stime from /proc/PID/stat, all
# threads) of the process under test ("server": nginx's worker, idemd, the
# Express app) and of the upstream's nginx worker when that is another
# process, before and after the measured run, and wrk's own ("client", from
# the shell's `times` around it); report.py prints it per request, and for
# the Redis rows the bound the machine's CPUs put on req/s: CPUs / (the CPU
# a request costs every process of the row, wrk included).
#   http2               not a wrk row: bench/h2.sh (issue 23), after the rounds,
#                       with its own nginx pair and idemd: nginx proxy_pass and
#                       idemd replays over HTTP/1.1 and HTTP/2 with h2load, and
#                       nginx and idemd new keys over both with bench/h2keys.c
#                       (build/bench/idem-h2keys); BENCH_SECONDS, BENCH_CONNECTIONS
#                       and BENCH_ROUNDS apply, 10 streams a connection.  Its
#                       table and verdict are printed after report.py's and kept
#                       as bench/results/h2-<run>.md; BENCH_STRICT fails on MISSED.
#   idemd-steady        after the rounds, not interleaved: new keys at full
#                       speed for BENCH_STEADY_SECONDS against an idemd of its
#                       own on a FRESH embedded store (BENCH_EMBEDDED, sync=interval)
#                       with key_ttl BENCH_STEADY_TTL; every 10 s the store's size
#                       on disk, its records (new keys - swept, from /metrics),
#                       requests answered and idemd's RSS.  The report prints
#                       the samples and whether the size stayed flat after the
#                       first TTL (bench/README.md states the rule).
# BENCH_ROWS (a comma-separated list of the row names above) measures only
# those rows; a server (Redis, PostgreSQL, the Express app) that no chosen
# row needs is not started.
# Every row sends the same POST (bench/post.lua), so the client's work per
# request is the same everywhere.  The rows are measured BENCH_ROUNDS times,
# interleaved (round 1 of every row, then round 2 ...), so a load that comes
# and goes on the machine spreads over all rows instead of spoiling one;
# both idemd processes (sync=always and sync=interval, each on its own copy
# of the preloaded store) therefore run for the whole benchmark, and the
# replay row uses the sync=always one.  bench/report.py takes each row's
# median over the rounds, prints the table (req/s, p50, p99, ratio to nginx
# proxy_pass and to nginx direct, targets) and writes
# bench/results/bench-<time>.json.
#
# Everything runs on loopback with ports picked free at start, in a fresh
# directory under BENCH_TMPDIR (nginx prefix, LMDB stores, wrk outputs);
# an EXIT trap stops every process this script started and removes that
# directory, on success, failure or ^C.  Every step is bounded by `timeout`.
# nginx runs in the foreground as the current user (root on the bench
# machine: its worker then runs as nobody) and is stopped by its pid.  Not
# part of `make test`.
#
# Environment (defaults in brackets):
#   IDEM_BUILD            build directory with idemd and bench/idem-preload [build]
#   BENCH_SECONDS         length of each measured wrk run [10]
#   BENCH_CONNECTIONS     wrk connections [32]
#   BENCH_THREADS         wrk threads [1]
#   BENCH_WARMUP          seconds of unmeasured wrk load before each measured run [2]
#   BENCH_ROUNDS          measured runs per row, interleaved; the median is reported [3]
#   BENCH_PRELOAD         completed keys written to the store first; 0 skips [1000000]
#   BENCH_MAP_SIZE        LMDB map_size of the stores [4GiB]
#   BENCH_EMBEDDED        the engine of the embedded rows (idemd-new-always,
#                         -interval, idemd-replay): lmdb or rocksdb [lmdb]
#   BENCH_WORKERS         idemd --workers [1]
#   BENCH_PROFILE         1: after the rounds, one more run per idemd row under perf
#                         stat and perf record (not measured), and print where idemd's
#                         time goes: self and inclusive time by function [0]
#   BENCH_LOG             1: keep idemd's log (one line per request) in the results [0]
#   BENCH_TMPDIR          where the work directory goes; must not be tmpfs for
#                         sync=always to mean anything [$TMPDIR or /tmp]
#   BENCH_RESULTS         where the JSON goes [bench/results]
#   BENCH_STRICT          1: exit 1 when a target is missed or a row had errors [0]
#   BENCH_SERVER_STORES   1: also the Redis and PostgreSQL rows (and Redis over TLS,
#                         Redis Cluster) [1]
#   BENCH_PRELOAD_SERVER  completed keys preloaded into Redis and PostgreSQL [100000]
#   BENCH_PG_WAL_WARM     WAL files (16 MB each) PostgreSQL writes and recycles before
#                         the rounds, so that they run on reused WAL files as a server
#                         that has run for a while does (bench/README.md, "Issue 20:
#                         PostgreSQL, second pass"); 0: none [32]
#   BENCH_EXPRESS         1: also the express-idempotency rows [1]
#   BENCH_EXPRESS_ADAPTER the middleware's store: map (a Map, O(1)) or default (the
#                         package's own in-memory adapter, an array scanned per
#                         request) [map]
#   BENCH_ROWS            comma-separated row names to measure; all of them when
#                         empty [all]
#   BENCH_STEADY_SECONDS  length of the idemd-steady run, at least TTL + 30 [180]
#   BENCH_STEADY_TTL      key_ttl of the idemd-steady run: N s or N m [10s]
#   BENCH_HS_SECONDS      length of each handshake measurement [5]
#   BENCH_HS_CLIENTS      `openssl s_time -new` clients at once in it [2]
#   BENCH_BASE_BUILD      another build directory (an older idemd, say): its idemd runs
#                         beside this one on copies of the same preloaded store, and
#                         rows base-new-always, base-new-interval and base-replay,
#                         interleaved with the others, measure it in the same run, so
#                         before and after share one nginx and one machine's load; with
#                         the server stores also base-new-pg (a second idemd on the
#                         same PostgreSQL) and base-new-redis (a second idemd on the
#                         same Redis server, its INFO commandstats and CPU recorded
#                         as idemd-new-redis's are), base-new-redis-cluster likewise
#                         on the Redis Cluster of idemd-new-redis-cluster [none]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

IDEM_BUILD=${IDEM_BUILD:-build}
BENCH_SECONDS=${BENCH_SECONDS:-10}
BENCH_CONNECTIONS=${BENCH_CONNECTIONS:-32}
BENCH_THREADS=${BENCH_THREADS:-1}
BENCH_WARMUP=${BENCH_WARMUP:-2}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
BENCH_PRELOAD=${BENCH_PRELOAD:-1000000}
BENCH_MAP_SIZE=${BENCH_MAP_SIZE:-4GiB}
BENCH_EMBEDDED=${BENCH_EMBEDDED:-lmdb}
BENCH_WORKERS=${BENCH_WORKERS:-1}
BENCH_PROFILE=${BENCH_PROFILE:-0}
BENCH_LOG=${BENCH_LOG:-0}
BENCH_TMPDIR=${BENCH_TMPDIR:-${TMPDIR:-/tmp}}
BENCH_RESULTS=${BENCH_RESULTS:-bench/results}
BENCH_SERVER_STORES=${BENCH_SERVER_STORES:-1}
BENCH_PRELOAD_SERVER=${BENCH_PRELOAD_SERVER:-100000}
BENCH_PG_WAL_WARM=${BENCH_PG_WAL_WARM:-32}
BENCH_EXPRESS=${BENCH_EXPRESS:-1}
BENCH_EXPRESS_ADAPTER=${BENCH_EXPRESS_ADAPTER:-map}
BENCH_ROWS=${BENCH_ROWS:-all}
BENCH_BASE_BUILD=${BENCH_BASE_BUILD:-}
BENCH_STEADY_SECONDS=${BENCH_STEADY_SECONDS:-180}
BENCH_STEADY_TTL=${BENCH_STEADY_TTL:-10s}
BENCH_HS_SECONDS=${BENCH_HS_SECONDS:-5}
BENCH_HS_CLIENTS=${BENCH_HS_CLIENTS:-2}
export BENCH_STRICT=${BENCH_STRICT:-0}

# Messages go to fd 9, a copy of the original stderr: a trap that fires
# while a command's output is redirected to a file still reaches the user.
exec 9>&2
say() { printf 'bench: %s\n' "$*" >&9; }
die() { printf 'bench: error: %s\n' "$*" >&9; exit 1; }

for v in BENCH_SECONDS BENCH_CONNECTIONS BENCH_THREADS BENCH_WARMUP BENCH_ROUNDS BENCH_PRELOAD \
  BENCH_WORKERS BENCH_SERVER_STORES BENCH_PRELOAD_SERVER BENCH_PG_WAL_WARM BENCH_EXPRESS BENCH_STEADY_SECONDS \
  BENCH_HS_SECONDS BENCH_HS_CLIENTS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number, not '${!v}'"
done
((BENCH_SECONDS >= 1 && BENCH_SECONDS <= 3600)) || die "BENCH_SECONDS must be 1..3600"
((BENCH_CONNECTIONS >= 1 && BENCH_CONNECTIONS <= 4000)) || die "BENCH_CONNECTIONS must be 1..4000"
((BENCH_THREADS >= 1 && BENCH_THREADS <= BENCH_CONNECTIONS)) ||
  die "BENCH_THREADS must be 1..BENCH_CONNECTIONS"
((BENCH_WARMUP <= 600)) || die "BENCH_WARMUP must be at most 600"
((BENCH_ROUNDS >= 1 && BENCH_ROUNDS <= 20)) || die "BENCH_ROUNDS must be 1..20"
((BENCH_WORKERS >= 1 && BENCH_WORKERS <= 64)) || die "BENCH_WORKERS must be 1..64"
((BENCH_HS_SECONDS >= 1 && BENCH_HS_SECONDS <= 600)) || die "BENCH_HS_SECONDS must be 1..600"
((BENCH_HS_CLIENTS >= 1 && BENCH_HS_CLIENTS <= 64)) || die "BENCH_HS_CLIENTS must be 1..64"
[[ $BENCH_EMBEDDED == lmdb || $BENCH_EMBEDDED == rocksdb ]] ||
  die "BENCH_EMBEDDED must be lmdb or rocksdb, not '$BENCH_EMBEDDED'"
[[ $BENCH_EXPRESS_ADAPTER == map || $BENCH_EXPRESS_ADAPTER == default ]] ||
  die "BENCH_EXPRESS_ADAPTER must be map or default, not '$BENCH_EXPRESS_ADAPTER'"
# The steady row's key_ttl, written into idemd's configuration as it is, and
# in seconds for the verdict (report.py compares the sizes of TTL..TTL + 20 s
# with those of the run's last 20 s after that).
if [[ $BENCH_STEADY_TTL =~ ^([0-9]{1,5})(s|m)$ ]]; then
  STEADY_TTL_SECONDS=$((10#${BASH_REMATCH[1]}))
  [[ ${BASH_REMATCH[2]} == m ]] && STEADY_TTL_SECONDS=$((STEADY_TTL_SECONDS * 60))
else
  die "BENCH_STEADY_TTL must be whole seconds or minutes (10s, 2m), not '$BENCH_STEADY_TTL'"
fi
((STEADY_TTL_SECONDS >= 1 && STEADY_TTL_SECONDS <= 3600)) || die "BENCH_STEADY_TTL must be 1s..60m"
((BENCH_STEADY_SECONDS <= 86400)) || die "BENCH_STEADY_SECONDS must be at most 86400"

ALL_ROWS=(nginx-direct nginx-proxy idemd-new-always idemd-new-interval idemd-replay
          idemd-new-redis idemd-replay-redis idemd-new-rediss idemd-new-redis-cluster
          idemd-new-redis-cluster-replicas idemd-new-pg idemd-replay-pg
          express-new express-replay
          base-new-always base-new-interval base-replay base-new-pg base-new-redis base-new-redis-cluster
          nginx-tls-listener idemd-tls-listener nginx-https-upstream idemd-https-upstream tls-handshakes
          idemd-workers-1 idemd-workers-auto
          http2 idemd-steady)
if [[ $BENCH_ROWS != all && -n $BENCH_ROWS ]]; then
  IFS=, read -r -a _rows <<<"$BENCH_ROWS"
  for _r in "${_rows[@]}"; do
    [[ " ${ALL_ROWS[*]} " == *" $_r "* ]] || die "BENCH_ROWS: no row '$_r' (rows: ${ALL_ROWS[*]})"
  done
fi
# want_row ROW: is ROW to be measured?
want_row() {
  [[ $BENCH_ROWS == all || -z $BENCH_ROWS || ,$BENCH_ROWS, == *",$1,"* ]]
}
# Issue 20: Redis over TLS and Redis Cluster, each with servers of its own.
REDISS=0 RCLUSTER=0 RCLUSTER_REPL=0
if [[ $BENCH_SERVER_STORES == 1 ]]; then
  want_row idemd-new-rediss && REDISS=1
  want_row idemd-new-redis-cluster && RCLUSTER=1
  want_row idemd-new-redis-cluster-replicas && RCLUSTER_REPL=1
  [[ -n $BENCH_BASE_BUILD ]] && want_row base-new-redis-cluster && RCLUSTER=1
fi
if [[ $BENCH_SERVER_STORES == 1 ]] && ! want_row idemd-new-redis && ! want_row idemd-replay-redis &&
  ! want_row idemd-new-pg && ! want_row idemd-replay-pg &&
  ! { [[ -n $BENCH_BASE_BUILD ]] && { want_row base-new-pg || want_row base-new-redis; }; }; then
  BENCH_SERVER_STORES=0
fi
if [[ $BENCH_EXPRESS == 1 ]] && ! want_row express-new && ! want_row express-replay; then
  BENCH_EXPRESS=0
fi
# The preloaded embedded stores and their two idemd processes (and the base
# build's) serve these rows only; without them there is nothing to preload.
EMBEDDED_ROWS=0
for _r in idemd-new-always idemd-new-interval idemd-replay base-new-always base-new-interval base-replay; do
  want_row "$_r" && EMBEDDED_ROWS=1
done
# The TLS rows: nginx's second instance (the TLS proxies), idemd with
# listen_tls (its TLS row and the handshakes), idemd with an https upstream.
FRONT=0 TLS_IDEMD=0 HTTPS_IDEMD=0
for _r in nginx-tls-listener nginx-https-upstream tls-handshakes; do want_row "$_r" && FRONT=1; done
want_row idemd-tls-listener && TLS_IDEMD=1
want_row tls-handshakes && TLS_IDEMD=1
want_row idemd-https-upstream && HTTPS_IDEMD=1
if ((EMBEDDED_ROWS == 0)); then
  BENCH_PROFILE=0
  # The TLS idemd processes run on copies of the preloaded store too.
  ((TLS_IDEMD == 1 || HTTPS_IDEMD == 1)) || BENCH_PRELOAD=0
fi
STEADY=0
want_row idemd-steady && STEADY=1
if ((STEADY == 1 && BENCH_STEADY_SECONDS < STEADY_TTL_SECONDS + 30)); then
  die "BENCH_STEADY_SECONDS must be at least BENCH_STEADY_TTL + 30 ($((STEADY_TTL_SECONDS + 30))): the" \
    "sizes of TTL..TTL + 20 s are compared with a later one"
fi

case $IDEM_BUILD in /*) ;; *) IDEM_BUILD=$ROOT/$IDEM_BUILD ;; esac
IDEMD=$IDEM_BUILD/idemd
PRELOAD_BIN=$IDEM_BUILD/bench/idem-preload
BASE_IDEMD= BASE_PG_IDEMD= BASE_REDIS_IDEMD= BASE_RC_IDEMD=
if [[ -n $BENCH_BASE_BUILD ]]; then
  case $BENCH_BASE_BUILD in /*) ;; *) BENCH_BASE_BUILD=$ROOT/$BENCH_BASE_BUILD ;; esac
  BASE_IDEMD=$BENCH_BASE_BUILD/idemd
  [[ -x $BASE_IDEMD ]] || die "BENCH_BASE_BUILD: $BASE_IDEMD is missing"
  # The base build's idemd on PostgreSQL (row base-new-pg).
  [[ $BENCH_SERVER_STORES == 1 ]] && want_row base-new-pg && BASE_PG_IDEMD=$BASE_IDEMD
  # ... and on Redis (row base-new-redis).
  [[ $BENCH_SERVER_STORES == 1 ]] && want_row base-new-redis && BASE_REDIS_IDEMD=$BASE_IDEMD
  ((RCLUSTER == 1)) && want_row base-new-redis-cluster && BASE_RC_IDEMD=$BASE_IDEMD
  ((EMBEDDED_ROWS == 1)) || BASE_IDEMD=  # no base row chosen: not started
fi
LUA=$ROOT/bench/post.lua

for t in nginx wrk curl python3 timeout openssl; do
  command -v "$t" >/dev/null || die "$t is not installed (make bench installs it: scripts/deps.sh bench)"
done
if [[ $BENCH_EXPRESS == 1 ]]; then
  for t in node npm; do
    command -v "$t" >/dev/null ||
      die "$t is not installed (make bench installs it: scripts/deps.sh bench); or set BENCH_EXPRESS=0"
  done
fi
[[ -x $IDEMD ]] || die "$IDEMD is missing: run 'make build', or set IDEM_BUILD"
if ((BENCH_PRELOAD > 0)) && [[ ! -x $PRELOAD_BIN ]]; then
  die "$PRELOAD_BIN is missing (built from bench/preload.c); or set BENCH_PRELOAD=0"
fi
newer=$(find src include -name '*.[ch]' -newer "$IDEMD" -print -quit 2>/dev/null || true)
[[ -z $newer ]] || say "warning: $newer is newer than $IDEMD: the binary may be stale"
if [[ $BENCH_PROFILE == 1 ]] && ! command -v perf >/dev/null; then
  say "warning: BENCH_PROFILE=1 but perf is not installed: no profile"
  BENCH_PROFILE=0
fi

# ---- work directory and clean-up -------------------------------------------

mkdir -p "$BENCH_TMPDIR"
WORK=$(mktemp -d "$BENCH_TMPDIR/idem-bench.XXXXXX")
PIDS=()  # every background process we started, stopped in reverse order

stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "process $pid did not stop in 10s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    stop_pid "${PIDS[i]}"
  done
  if [[ -d $WORK/services ]]; then
    IDEM_TEST_REDIS_PORT=$REDIS_PORT IDEM_TEST_PG_PORT=$PG_PORT \
      timeout 120 bash scripts/services.sh stop "$WORK/services" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM

forget_pid() {
  local keep=() p
  for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# ---- helpers ------------------------------------------------------------------

# Forty-four distinct free loopback ports (held open together while picked);
# the clusters' nodes pick their own (tests/cluster.py).
read -r UP_PORT PROXY_PORT IDEM_A_PORT ADMIN_A_PORT IDEM_I_PORT ADMIN_I_PORT \
  IDEM_R_PORT ADMIN_R_PORT IDEM_P_PORT ADMIN_P_PORT REDIS_PORT PG_PORT EXPRESS_PORT \
  BASE_A_PORT BASE_A_ADMIN BASE_I_PORT BASE_I_ADMIN IDEM_S_PORT ADMIN_S_PORT \
  TLS_UP_PORT FRONT_TLS_PORT FRONT_HTTPS_PORT IDEM_T_PORT IDEM_T_TLS_PORT ADMIN_T_PORT \
  IDEM_H_PORT ADMIN_H_PORT BASE_P_PORT BASE_P_ADMIN \
  REDISS_PORT IDEM_RS_PORT ADMIN_RS_PORT IDEM_RC_PORT ADMIN_RC_PORT \
  IDEM_W1_PORT ADMIN_W1_PORT IDEM_WA_PORT ADMIN_WA_PORT IDEM_RCR_PORT ADMIN_RCR_PORT \
  BASE_R_PORT BASE_R_ADMIN BASE_RC_PORT BASE_RC_ADMIN < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(44)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)

# Random per run, so that keys of reruns against one store never collide.
RUNID=b$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')

# http_code METHOD URL [curl args...]: the status, or 000 when no answer.
http_code() {
  local m=$1 u=$2
  shift 2
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 "${CURL_TLS[@]}" -X "$m" "$@" "$u" 2>/dev/null || true
}

# wait_http URL PID SECONDS: until GET URL answers 200, while PID lives.
wait_http() {
  local url=$1 pid=$2 secs=$3 i
  for ((i = 0; i < secs * 10; i++)); do
    [[ $(http_code GET "$url") == 200 ]] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

wrk_cmd() { # SECONDS URL MODE ARG [--latency]
  local secs=$1 url=$2 mode=$3 arg=$4
  shift 4
  timeout --kill-after=5 $((secs + 60)) \
    wrk -t"$BENCH_THREADS" -c"$BENCH_CONNECTIONS" -d"${secs}s" --timeout 10s "$@" \
    -s "$LUA" "$url" -- "$mode" "$arg"
}

# cpu_ticks PID: the process's utime + stime (all its threads), in clock
# ticks (getconf CLK_TCK, in meta.json); 0 when it is gone.
cpu_ticks() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return 0; }
  st=${st##*) }  # past "pid (comm) ": field 1 is the state, 12 utime, 13 stime
  read -r -a _f <<<"$st"
  echo $((_f[11] + _f[12]))
}

# tree_ticks PID: cpu_ticks of PID, plus what its reaped children used
# (cutime + cstime) and every live child's own utime + stime + cutime +
# cstime: the CPU of a server made of processes (PostgreSQL's postmaster,
# one backend per connection, the WAL writer, autovacuum...), including the
# backends that ended during the run.  0 when PID is gone.
tree_ticks() {
  local st c total
  st=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return 0; }
  st=${st##*) }
  read -r -a _f <<<"$st"
  total=$((_f[11] + _f[12] + _f[13] + _f[14]))
  for c in $(pgrep -P "$1" || true); do
    st=$(cat "/proc/$c/stat" 2>/dev/null) || continue
    st=${st##*) }
    read -r -a _f <<<"$st"
    total=$((total + _f[11] + _f[12] + _f[13] + _f[14]))
  done
  echo "$total"
}

# store_pid KIND: the pid of the Redis server or of PostgreSQL's postmaster
# that scripts/services.sh started, of the TLS Redis (rediss), or the node
# pids of a Redis Cluster joined by commas: every node (cluster, cluster-r),
# its masters only (cluster-r-masters) or its replicas only
# (cluster-r-replicas); empty when it is not running.
store_pid() {
  local p
  case $1 in
    redis) cat "$WORK/services/redis/redis.pid" 2>/dev/null || true ;;
    pg) head -1 "$WORK/services/pg/data/postmaster.pid" 2>/dev/null || true ;;
    rediss) echo "${REDISS_SERVER_PID:-}" ;;
    cluster) p=${CLUSTER_NODE_PIDS:-}; echo "${p// /,}" ;;
    cluster-r) p="${CLUSTER_R_MASTER_PIDS:-} ${CLUSTER_R_REPLICA_PIDS:-}"; p=${p# }; p=${p% }; echo "${p// /,}" ;;
    cluster-r-masters) p=${CLUSTER_R_MASTER_PIDS:-}; echo "${p// /,}" ;;
    cluster-r-replicas) p=${CLUSTER_R_REPLICA_PIDS:-}; echo "${p// /,}" ;;
  esac
}

# store_ticks PID[,PID...]: tree_ticks of each, summed (a Redis Cluster's
# nodes are one store); empty when one of them is gone, so that the role
# has no figure rather than a wrong one.
store_ticks() {
  local p total=0
  IFS=, read -r -a _pids <<<"$1"
  for p in "${_pids[@]}"; do
    [[ -d /proc/$p ]] || return 0
    total=$((total + $(tree_ticks "$p")))
  done
  echo "$total"
}

# row_pids ROW: "ROLE PID" lines, the processes whose CPU a row records:
# server (what is measured), upstream (nginx's upstream worker, when it
# is not the server's own process) and store (the Redis or PostgreSQL
# server of the row, all its processes: tree_ticks; for a Redis Cluster
# its nodes, as one comma-joined "pid": store_ticks sums them; the cluster
# with replicas also as masters and replicas apart).
row_pids() {
  case $1 in
    nginx-direct | nginx-proxy) echo "server $NGINX_WORKER" ;;
    nginx-tls-listener | nginx-https-upstream) printf 'server %s\nupstream %s\n' "$FRONT_WORKER" "$NGINX_WORKER" ;;
    idemd-new-always | idemd-replay) printf 'server %s\nupstream %s\n' "$ALWAYS_PID" "$NGINX_WORKER" ;;
    idemd-new-interval) printf 'server %s\nupstream %s\n' "$INTERVAL_PID" "$NGINX_WORKER" ;;
    idemd-tls-listener) printf 'server %s\nupstream %s\n' "$TLS_PID" "$NGINX_WORKER" ;;
    idemd-https-upstream) printf 'server %s\nupstream %s\n' "$HTTPS_PID" "$NGINX_WORKER" ;;
    idemd-workers-1) printf 'server %s\nupstream %s\n' "$W1_PID" "$NGINX_WORKER" ;;
    idemd-workers-auto) printf 'server %s\nupstream %s\n' "$WA_PID" "$NGINX_WORKER" ;;
    base-new-always | base-replay) printf 'server %s\nupstream %s\n' "$BASE_ALWAYS_PID" "$NGINX_WORKER" ;;
    base-new-interval) printf 'server %s\nupstream %s\n' "$BASE_INTERVAL_PID" "$NGINX_WORKER" ;;
    idemd-new-redis | idemd-replay-redis)
      printf 'server %s\nupstream %s\nstore %s\n' "$REDIS_PID" "$NGINX_WORKER" "$(store_pid redis)" ;;
    idemd-new-rediss)
      printf 'server %s\nupstream %s\nstore %s\n' "$RS_PID" "$NGINX_WORKER" "$(store_pid rediss)" ;;
    idemd-new-redis-cluster)
      printf 'server %s\nupstream %s\nstore %s\n' "$RC_PID" "$NGINX_WORKER" "$(store_pid cluster)" ;;
    idemd-new-redis-cluster-replicas)
      printf 'server %s\nupstream %s\nstore %s\nmasters %s\nreplicas %s\n' "$RCR_PID" "$NGINX_WORKER" \
        "$(store_pid cluster-r)" "$(store_pid cluster-r-masters)" "$(store_pid cluster-r-replicas)" ;;
    idemd-new-pg | idemd-replay-pg)
      printf 'server %s\nupstream %s\nstore %s\n' "$PG_PID" "$NGINX_WORKER" "$(store_pid pg)" ;;
    base-new-pg)
      printf 'server %s\nupstream %s\nstore %s\n' "$BASE_PG_PID" "$NGINX_WORKER" "$(store_pid pg)" ;;
    base-new-redis)
      printf 'server %s\nupstream %s\nstore %s\n' "$BASE_REDIS_PID" "$NGINX_WORKER" "$(store_pid redis)" ;;
    base-new-redis-cluster)
      printf 'server %s\nupstream %s\nstore %s\n' "$BASE_RC_PID" "$NGINX_WORKER" "$(store_pid cluster)" ;;
    express-new | express-replay) printf 'server %s\nupstream %s\n' "$EXPRESS_PID" "$NGINX_WORKER" ;;
  esac
}

# cpu_snapshot ROW FILE: "ROLE PID TICKS" for each of row_pids ROW.
cpu_snapshot() {
  local role pid t
  while read -r role pid; do
    [[ -n $role && -n $pid ]] || continue
    if [[ $role == store || $role == masters || $role == replicas ]]; then
      t=$(store_ticks "$pid")
      if [[ -n $t ]]; then printf '%s %s %s\n' "$role" "$pid" "$t"; fi
    else
      printf '%s %s %s\n' "$role" "$pid" "$(cpu_ticks "$pid")"
    fi
  done < <(row_pids "$1") >"$2"
}

# redis_nodes ROW: "host:port" of each plain Redis server of a Redis row,
# replicas included (the rediss row's server is left out: redis-cli would
# need its TLS).
redis_nodes() {
  case $1 in
    idemd-new-redis | idemd-replay-redis | base-new-redis) echo "127.0.0.1:$REDIS_PORT" ;;
    idemd-new-redis-cluster | base-new-redis-cluster) echo "${CLUSTER_NODES//,/ }" ;;
    idemd-new-redis-cluster-replicas) echo "${CLUSTER_R_NODES//,/ }" ;;
  esac
}

# client_ticks TIMES: "client wrk TICKS", wrk's user + system time as the
# subshell's `times` printed it (its second line: the children's), in clock
# ticks (rounded to the nearest).
client_ticks() {
  awk -v clk="$(getconf CLK_TCK)" 'NR == 2 {
      t = 0
      for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
      printf "client wrk %d\n", t * clk + 0.5 }' "$1"
}

# cmdstats_reset ROW / cmdstats_save ROW FILE: the Redis servers' INFO
# commandstats over the measured run only (CONFIG RESETSTAT before it), and
# one line of the script commands' calls and usec_per_call, summed over the
# nodes (issue 20: one EVALSHA per batch and node, no MULTI/EXEC; on a
# replica, MULTI/EXEC is the replication stream applying a script's
# effects).
cmdstats_reset() {
  local n
  for n in $(redis_nodes "$1"); do
    redis-cli -h "${n%:*}" -p "${n##*:}" CONFIG RESETSTAT >/dev/null 2>&1 || true
  done
}
cmdstats_save() {
  local n nodes
  nodes=$(redis_nodes "$1")
  [[ -n $nodes ]] || return 0
  for n in $nodes; do
    echo "# $n"
    redis-cli -h "${n%:*}" -p "${n##*:}" INFO commandstats 2>/dev/null | tr -d '\r'
  done >"$2"
  say "$1 commandstats: $(awk -F'[:,=]' '
    /^cmdstat_(evalsha|multi|exec|eval):/ { c[$1] += $3; u[$1] += $5 }
    END { for (k in c) printf "%s calls=%d usec=%d usec_per_call=%.2f  ", substr(k, 9), c[k], u[k], c[k] ? u[k] / c[k] : 0 }' "$2")"
}

# measure ROW ROUND URL MODE ARG [ADMIN_URL]: warm up, then the measured run
# to $WORK/ROW.rROUND.wrk; with ADMIN_URL, /metrics is scraped around it; the
# CPU of the row's processes (row_pids) to ROW.rROUND.cpu.before/.after.
measure() {
  local row=$1 round=$2 url=$3 mode=$4 arg=$5 admin=${6:-}
  local out=$WORK/$row.r$round
  if ((BENCH_WARMUP > 0)); then
    # A unique-key warm-up uses keys of its own.
    local warm_arg=$arg
    [[ $mode == unique ]] && warm_arg=${arg}w
    wrk_cmd "$BENCH_WARMUP" "$url" "$mode" "$warm_arg" >"$out.warmup" 2>&1 ||
      die "$row: warm-up wrk failed: $(tail -3 "$out.warmup")"
  fi
  if [[ -n $admin ]]; then
    curl -sf --max-time 5 "$admin/metrics" >"$out.metrics.before" ||
      die "$row: cannot read $admin/metrics (did idemd die?)"
  fi
  cmdstats_reset "$row"
  cpu_snapshot "$row" "$out.cpu.before"
  # In a subshell of its own, so that `times` (its children's user and
  # system time) is wrk's (through timeout, which reaps it) and nothing else.
  (
    wrk_cmd "$BENCH_SECONDS" "$url" "$mode" "$arg" --latency >"$out.wrk" 2>&1 || exit 1
    times >"$out.times"
  ) || die "$row: wrk failed: $(tail -3 "$out.wrk")"
  cpu_snapshot "$row" "$out.cpu.after"
  client_ticks "$out.times" >>"$out.cpu.after"
  echo "client wrk 0" >>"$out.cpu.before"
  cmdstats_save "$row" "$out.cmdstats"
  if [[ -n $admin ]]; then
    curl -sf --max-time 5 "$admin/metrics" >"$out.metrics.after" ||
      die "$row: cannot read $admin/metrics after the run (did idemd die?)"
  fi
  local rps p99 non2xx
  rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out.wrk")
  p99=$(awk '$1 == "99%" {print $2}' "$out.wrk")
  non2xx=$(awk -F': *' '/Non-2xx or 3xx responses/ {print $2}' "$out.wrk")
  say "round $round/$BENCH_ROUNDS  $(printf '%-20s' "$row") ${rps:-?} req/s, p99 ${p99:-?}${non2xx:+, $non2xx NON-2XX ANSWERS}"
}

# profile ROW URL MODE ARG PID: one more (unmeasured) run with perf on PID.
profile() {
  local row=$1 url=$2 mode=$3 arg=$4 pid=$5
  say "$row: profiling idemd (pid $pid) for ${BENCH_SECONDS}s"
  local pdata=$WORK/$row.perf.data out=$WORK/$row.profile.txt
  # DWARF call chains (from .eh_frame, so any build works): an optimised
  # build has no frame pointers.  499 Hz keeps the data to ~100 MB.
  timeout $((BENCH_SECONDS + 60)) perf record -F 499 --call-graph dwarf,16384 -p "$pid" -o "$pdata" \
    -- sleep "$BENCH_SECONDS" >"$WORK/$row.perf-record.log" 2>&1 &
  local rec=$!
  PIDS+=("$rec")
  timeout $((BENCH_SECONDS + 60)) perf stat -e task-clock,context-switches,cpu-migrations,page-faults \
    -p "$pid" -- sleep "$BENCH_SECONDS" >"$WORK/$row.perf-stat.txt" 2>&1 &
  local st=$!
  PIDS+=("$st")
  local warg=$arg
  [[ $mode == unique ]] && warg=${arg}p
  wrk_cmd "$BENCH_SECONDS" "$url" "$mode" "$warg" --latency >"$WORK/$row.profile.wrk" 2>&1 || true
  wait "$rec" 2>/dev/null || true
  wait "$st" 2>/dev/null || true
  forget_pid "$rec"
  forget_pid "$st"
  {
    echo "== $row: wrk during the profile (perf adds overhead) =="
    grep -E 'Requests/sec|requests in' "$WORK/$row.profile.wrk" || true
    echo
    echo "== perf stat -p <idemd> =="
    grep -vE '^\s*$' "$WORK/$row.perf-stat.txt" || true
    echo
    echo "== perf report: self time by symbol, all of idemd's threads =="
    timeout 300 perf report -i "$pdata" --stdio --no-children -g none --sort dso,symbol \
      --percent-limit 0.7 2>/dev/null | grep -vE '^#|^\s*$' | head -40 || true
    echo
    echo "== perf report: inclusive time (callees included) of idemd's own and library functions =="
    timeout 300 perf report -i "$pdata" --stdio --children -g none --sort symbol \
      2>/dev/null | grep -vE '^#|^\s*$|\[k\]|\] 0x[0-9a-f]+ ' | head -45 || true
  } >"$out"
  cat "$out" >&9
}

# handshakes ROW ROUND PORT PID: BENCH_HS_CLIENTS `openssl s_time -new`
# clients at once for BENCH_HS_SECONDS against 127.0.0.1:PORT, each
# connection a full handshake (no session resumed) closed right after it;
# their outputs to ROW.rROUND.stime.K, and the server process's CPU and the
# wall time to ROW.rROUND.hs ("cpu PID BEFORE AFTER", "wall_us N").
handshakes() {
  local row=$1 round=$2 port=$3 pid=$4 out=$WORK/$1.r$2 k p rc=0 c0 c1 t0 t1 n
  local clients=()
  c0=$(cpu_ticks "$pid")
  t0=${EPOCHREALTIME/./}
  for ((k = 1; k <= BENCH_HS_CLIENTS; k++)); do
    timeout --kill-after=5 $((BENCH_HS_SECONDS + 30)) openssl s_time -connect "127.0.0.1:$port" -new \
      -time "$BENCH_HS_SECONDS" -CAfile "$CERTS/ca.pem" >"$out.stime.$k" 2>&1 </dev/null &
    clients+=("$!")
    PIDS+=("$!")
  done
  for p in "${clients[@]}"; do
    wait "$p" || rc=$?
    forget_pid "$p"
  done
  t1=${EPOCHREALTIME/./}
  c1=$(cpu_ticks "$pid")
  ((rc == 0)) || die "$row: openssl s_time failed (status $rc): $(tail -3 "$out.stime.1")"
  printf 'cpu %s %s %s\nwall_us %s\n' "$pid" "$c0" "$c1" $((t1 - t0)) >"$out.hs"
  n=$(awk '/connections in [0-9.]+ real seconds/ {s += $1} END {print s + 0}' "$out".stime.*)
  say "round $round/$BENCH_ROUNDS  $(printf '%-20s' "$row") $((n * 1000000 / (t1 - t0))) handshakes/s"
}

# ---- nginx ------------------------------------------------------------------

# The TLS rows' certificates (a CA, a server certificate for localhost and
# 127.0.0.1), made afresh each run: nginx.conf.in's TLS upstream needs them.
CERTS=$WORK/certs
mkdir -p "$CERTS"
timeout 60 python3 tests/certs.py "$CERTS" >"$WORK/certs.log" 2>&1 ||
  die "tests/certs.py could not make the certificates: $(tail -3 "$WORK/certs.log")"
CURL_TLS=(--cacert "$CERTS/ca.pem")

# start_nginx DIR TEMPLATE: nginx with TEMPLATE's configuration, its prefix
# DIR; sets NGINX_STARTED (the master's pid).
start_nginx() {
  local dir=$1 tpl=$2
  mkdir -p "$dir"
  sed -e "s#@PREFIX@#$dir#g" -e "s#@UPSTREAM_PORT@#$UP_PORT#g" -e "s#@PROXY_PORT@#$PROXY_PORT#g" \
    -e "s#@TLS_UPSTREAM_PORT@#$TLS_UP_PORT#g" -e "s#@FRONT_TLS_PORT@#$FRONT_TLS_PORT#g" \
    -e "s#@FRONT_HTTPS_PORT@#$FRONT_HTTPS_PORT#g" -e "s#@CERTS@#$CERTS#g" "$tpl" >"$dir/nginx.conf"
  timeout 30 nginx -t -q -e "$dir/nginx-error.log" -p "$dir/" -c "$dir/nginx.conf" ||
    die "nginx -t refused $dir/nginx.conf"
  nginx -e "$dir/nginx-error.log" -p "$dir/" -c "$dir/nginx.conf" -g 'daemon off;' \
    >"$dir/stdout.log" 2>&1 &
  NGINX_STARTED=$!
  PIDS+=("$NGINX_STARTED")
}

# nginx_worker MASTER_PID: the pid of its one worker (worker_processes 1).
nginx_worker() {
  local w i
  for ((i = 0; i < 50; i++)); do
    w=$(pgrep -P "$1" | head -1 || true)
    [[ -n $w ]] && { echo "$w"; return 0; }
    sleep 0.1
  done
  die "nginx (pid $1) has no worker process"
}

NGX=$WORK/nginx
start_nginx "$NGX" bench/nginx.conf.in
NGINX_PID=$NGINX_STARTED
UP_URL=http://127.0.0.1:$UP_PORT/
PROXY_URL=http://127.0.0.1:$PROXY_PORT/
wait_http "$UP_URL" "$NGINX_PID" 15 || die "nginx did not start: $(tail -5 "$NGX/nginx-error.log")"
[[ $(http_code POST "$PROXY_URL" -d '{}') == 200 ]] || die "nginx proxy_pass does not answer 200"
NGINX_WORKER=$(nginx_worker "$NGINX_PID")
TLS_UP_URL=https://127.0.0.1:$TLS_UP_PORT/
[[ $(http_code POST "$TLS_UP_URL" -d '{}') == 200 ]] || die "nginx's TLS upstream does not answer 200"
if ((FRONT == 1)); then
  NGXF=$WORK/nginx-front
  start_nginx "$NGXF" bench/nginx-front.conf.in
  FRONT_PID=$NGINX_STARTED
  FRONT_TLS_URL=https://127.0.0.1:$FRONT_TLS_PORT/
  FRONT_HTTPS_URL=http://127.0.0.1:$FRONT_HTTPS_PORT/
  wait_http "$FRONT_HTTPS_URL" "$FRONT_PID" 15 ||
    die "nginx (front) did not start or its https upstream fails: $(tail -5 "$NGXF/nginx-error.log")"
  [[ $(http_code POST "$FRONT_TLS_URL" -d '{}') == 200 ]] || die "nginx's TLS listener does not answer 200"
  FRONT_WORKER=$(nginx_worker "$FRONT_PID")
fi

# tls_brief PORT: the protocol and cipher suite a client negotiates there.
tls_brief() {
  timeout 10 openssl s_client -connect "127.0.0.1:$1" -brief -CAfile "$CERTS/ca.pem" </dev/null 2>&1 |
    awk -F': ' '/^Protocol version/ {p = $2} /^Ciphersuite/ {c = $2} /^Server Temp Key/ {k = $2}
      END {print p ", " c ", " k}' || true
}

# ---- parameters, for the report ---------------------------------------------------

data_fs=$(df --output=fstype "$WORK" 2>/dev/null | tail -1 || stat -f -c %T "$WORK")
[[ $data_fs != tmpfs ]] ||
  say "warning: $WORK is on tmpfs: fsync costs nothing there, sync=always is not measured"
export BENCH_META_DATE BENCH_META_GIT BENCH_META_FS BENCH_META_CPUS BENCH_META_KERNEL \
  BENCH_META_NGINX BENCH_META_WRK BENCH_META_IDEMD BENCH_META_CPU BENCH_META_LOAD
BENCH_META_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
BENCH_META_GIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
BENCH_META_FS=$data_fs
BENCH_META_CPUS=$(nproc)
BENCH_META_KERNEL=$(uname -r)
BENCH_META_NGINX=$(nginx -v 2>&1 | sed 's/.*version: //')
BENCH_META_WRK=$(wrk -v 2>&1 | head -1 || true)
BENCH_META_IDEMD="$IDEMD ($("$IDEMD" --version 2>/dev/null || echo '?'))"
BENCH_META_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
BENCH_META_CPU=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
export IDEM_BUILD BENCH_SECONDS BENCH_CONNECTIONS BENCH_THREADS BENCH_WARMUP BENCH_ROUNDS \
  BENCH_PRELOAD BENCH_MAP_SIZE BENCH_WORKERS BENCH_EMBEDDED BENCH_STEADY_SECONDS BENCH_STEADY_TTL \
  STEADY_TTL_SECONDS
write_meta() { # extra JSON fields as NAME=VALUE... (strings)
  python3 - "$WORK/meta.json" "$@" <<'PY'
import json, os, sys
e = os.environ
path = sys.argv[1]
meta = {
    "date": e["BENCH_META_DATE"], "git": e["BENCH_META_GIT"],
    "cpus": int(e["BENCH_META_CPUS"]), "cpu": e["BENCH_META_CPU"], "kernel": e["BENCH_META_KERNEL"],
    "nginx": e["BENCH_META_NGINX"], "wrk": e["BENCH_META_WRK"], "idemd": e["BENCH_META_IDEMD"],
    "build": e["IDEM_BUILD"], "seconds": int(e["BENCH_SECONDS"]),
    "connections": int(e["BENCH_CONNECTIONS"]), "threads": int(e["BENCH_THREADS"]),
    "warmup_seconds": int(e["BENCH_WARMUP"]), "rounds": int(e["BENCH_ROUNDS"]),
    "preload": int(e["BENCH_PRELOAD"]), "map_size": e["BENCH_MAP_SIZE"],
    "workers": int(e["BENCH_WORKERS"]), "data_fs": e["BENCH_META_FS"],
    "embedded": e["BENCH_EMBEDDED"],
    "steady_seconds": int(e["BENCH_STEADY_SECONDS"]), "steady_ttl": e["BENCH_STEADY_TTL"],
    "steady_ttl_seconds": int(e["STEADY_TTL_SECONDS"]),
    "loadavg_at_start": e["BENCH_META_LOAD"],
}
if os.path.exists(path):
    with open(path) as f:
        meta.update(json.load(f))
for kv in sys.argv[2:]:
    k, _, v = kv.partition("=")
    meta[k] = v
with open(path, "w") as f:
    json.dump(meta, f, indent=2)
PY
}
write_meta
write_meta clk_tck="$(getconf CLK_TCK)" hs_seconds="$BENCH_HS_SECONDS" hs_clients="$BENCH_HS_CLIENTS" \
  openssl="$(openssl version)"

say "work dir $WORK ($data_fs); nginx upstream :$UP_PORT, proxy :$PROXY_PORT$( ((EMBEDDED_ROWS == 0)) ||
    echo "; idemd sync=always :$IDEM_A_PORT (admin :$ADMIN_A_PORT), sync=interval :$IDEM_I_PORT (admin :$ADMIN_I_PORT)")"

# ---- the stores -------------------------------------------------------------------

ALWAYS_DIR=$WORK/store-always
INTERVAL_DIR=$WORK/store-interval
# embedded_url DIR SYNC: the URL of the embedded rows' store in DIR.
embedded_url() {
  if [[ $BENCH_EMBEDDED == rocksdb ]]; then
    echo "rocksdb:$1?sync=$2"
  else
    echo "lmdb:$1?sync=$2&map_size=$BENCH_MAP_SIZE"
  fi
}
preload_secs=0
if ((BENCH_PRELOAD > 0)); then
  say "preloading $BENCH_PRELOAD completed keys ($PRELOAD_BIN)"
  t0=$(date +%s.%N)
  timeout --kill-after=5 "${BENCH_PRELOAD_TIMEOUT:-1800}" "$PRELOAD_BIN" \
    "$(embedded_url "$ALWAYS_DIR" interval)" "$BENCH_PRELOAD" \
    >"$WORK/preload.log" 2>&1 || die "idem-preload failed: $(tail -5 "$WORK/preload.log")"
  t1=$(date +%s.%N)
  preload_secs=$(python3 -c "print(round($t1 - $t0, 1))")
  # The sync=interval process gets a copy of the same store (the store is
  # closed now; LMDB re-creates its lock file on open, RocksDB its LOCK), and
  # so does each process of BENCH_BASE_BUILD.
  copies=("$INTERVAL_DIR")
  [[ -n $BASE_IDEMD ]] && copies+=("$WORK/store-base-always" "$WORK/store-base-interval")
  ((TLS_IDEMD == 1)) && copies+=("$WORK/store-tls")
  ((HTTPS_IDEMD == 1)) && copies+=("$WORK/store-https")
  for d in "${copies[@]}"; do
    if [[ $BENCH_EMBEDDED == rocksdb ]]; then
      cp -a "$ALWAYS_DIR" "$d"
    else
      mkdir -p "$d"
      chmod 700 "$d"
      cp "$ALWAYS_DIR/data.mdb" "$d/data.mdb"
    fi
  done
  say "preloaded in ${preload_secs}s ($BENCH_EMBEDDED); store $(du -sh --apparent-size "$ALWAYS_DIR" | cut -f1)"
fi
write_meta preload_seconds="$preload_secs" \
  store_bytes="$(du -sb --apparent-size "$ALWAYS_DIR" 2>/dev/null | cut -f1 || echo 0)"

# ---- idemd --------------------------------------------------------------------------

cat >"$WORK/idemd.yaml" <<'EOF'
# bench/run.sh: every POST needs a key; nothing else is keyed.
routes:
  - methods: [POST]
    path: /
    mode: required
EOF

# start_idemd NAME PORT ADMIN_PORT STORE_URL: sets IDEMD_PID.  IDEMD_CONFIG,
# IDEMD_UPSTREAM and IDEMD_BIN replace the defaults; with IDEMD_MAY_REFUSE=1
# a configuration idemd -t refuses returns 1 (its message in IDEMD_REFUSED)
# instead of ending the run.
start_idemd() {
  local name=$1 port=$2 aport=$3 url=$4 log=/dev/null
  local args=(--config "${IDEMD_CONFIG:-$WORK/idemd.yaml}" --listen "127.0.0.1:$port" --admin "127.0.0.1:$aport"
              --upstream "${IDEMD_UPSTREAM:-http://127.0.0.1:$UP_PORT}" --store "$url" --workers "$BENCH_WORKERS")
  local bin=${IDEMD_BIN:-$IDEMD} trc=0
  timeout 30 "$bin" -t "${args[@]}" >/dev/null 2>"$WORK/$name.check.log" || trc=$?
  if ((trc != 0)); then
    IDEMD_REFUSED=$(tail -1 "$WORK/$name.check.log")
    [[ ${IDEMD_MAY_REFUSE:-0} == 1 ]] && return 1
    cat "$WORK/$name.check.log" >&9
    die "idemd -t refused the bench configuration"
  fi
  [[ $BENCH_LOG == 1 ]] && log=$WORK/$name.idemd.log
  "$bin" "${args[@]}" 2>"$log" &
  IDEMD_PID=$!
  PIDS+=("$IDEMD_PID")
  if ! wait_http "http://127.0.0.1:$aport/readyz" "$IDEMD_PID" 60; then
    local st=running
    kill -0 "$IDEMD_PID" 2>/dev/null || { wait "$IDEMD_PID" && st=0 || st=$?; }
    die "$name: idemd did not become ready (status $st); rerun with BENCH_LOG=1 to keep its log"
  fi
}

# stop_idemd NAME PID: SIGTERM, and it should exit 0 (docs/protocol.md section 14).
stop_idemd() {
  local name=$1 pid=$2 rc=0
  kill -TERM "$pid" 2>/dev/null || true
  timeout 30 tail --pid="$pid" -f /dev/null || { say "$name: idemd did not stop in 30s"; kill -KILL "$pid"; }
  wait "$pid" || rc=$?
  forget_pid "$pid"
  ((rc == 0)) || say "warning: $name: idemd exited with status $rc on SIGTERM"
  write_meta "${name}_exit_status=$rc"
}

BODY='{"amount":1250,"currency":"EUR","account":"acct_1","note":"bench"}'

# check_key URL KEY: the first POST is forwarded (200), the second is a replay.
check_key() {
  local url=$1 key=$2 hdrs code
  code=$(http_code POST "$url" -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $key" --data-raw "$BODY")
  [[ $code == 200 ]] || die "idemd at $url answered $code to a first POST with key $key (want 200)"
  hdrs=$(curl -s -D - -o /dev/null --max-time 5 "${CURL_TLS[@]}" -X POST -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $key" --data-raw "$BODY" "$url" | tr -d '\r')
  grep -qi '^HTTP/1.1 200' <<<"$hdrs" || die "idemd's replay of $key is not a 200: $(head -1 <<<"$hdrs")"
  grep -qi '^x-idempotent-replay: *true' <<<"$hdrs" ||
    die "idemd's second answer for $key carries no X-Idempotent-Replay: true"
}

IDEM_A_URL=http://127.0.0.1:$IDEM_A_PORT/
IDEM_I_URL=http://127.0.0.1:$IDEM_I_PORT/
ADMIN_A_URL=http://127.0.0.1:$ADMIN_A_PORT
ADMIN_I_URL=http://127.0.0.1:$ADMIN_I_PORT
# The replay rows' key: completed once here, replayed by every request after.
REPLAY_KEY=$RUNID-replay
if ((EMBEDDED_ROWS == 1)); then
  start_idemd idemd-always "$IDEM_A_PORT" "$ADMIN_A_PORT" "$(embedded_url "$ALWAYS_DIR" always)"
  ALWAYS_PID=$IDEMD_PID
  start_idemd idemd-interval "$IDEM_I_PORT" "$ADMIN_I_PORT" "$(embedded_url "$INTERVAL_DIR" interval)"
  INTERVAL_PID=$IDEMD_PID
  check_key "$IDEM_A_URL" "$RUNID-check-always"
  check_key "$IDEM_I_URL" "$RUNID-check-interval"
  check_key "$IDEM_A_URL" "$REPLAY_KEY"
fi
if [[ -n $BASE_IDEMD ]]; then
  BASE_A_URL=http://127.0.0.1:$BASE_A_PORT/
  BASE_I_URL=http://127.0.0.1:$BASE_I_PORT/
  IDEMD_BIN=$BASE_IDEMD start_idemd base-always "$BASE_A_PORT" "$BASE_A_ADMIN" \
    "$(embedded_url "$WORK/store-base-always" always)"
  BASE_ALWAYS_PID=$IDEMD_PID
  IDEMD_BIN=$BASE_IDEMD start_idemd base-interval "$BASE_I_PORT" "$BASE_I_ADMIN" \
    "$(embedded_url "$WORK/store-base-interval" interval)"
  BASE_INTERVAL_PID=$IDEMD_PID
  check_key "$BASE_A_URL" "$RUNID-check-base-always"
  check_key "$BASE_I_URL" "$RUNID-check-base-interval"
  check_key "$BASE_A_URL" "$REPLAY_KEY"
  write_meta base_idemd="$BASE_IDEMD ($("$BASE_IDEMD" --version 2>/dev/null || echo '?'))"
  say "base build: idemd sync=always :$BASE_A_PORT, sync=interval :$BASE_I_PORT ($BASE_IDEMD)"
fi

# ---- idemd over TLS ------------------------------------------------------------------
#
# Each on its own copy of the preloaded store, sync=interval: the CPU-bound
# new-key path (idemd-new-interval's), so that the CPU TLS adds shows.

if ((TLS_IDEMD == 1)); then
  cat >"$WORK/idemd-tls.yaml" <<EOF
# bench/run.sh, the TLS listener rows: every POST needs a key.
listen_tls:
  address: 127.0.0.1:$IDEM_T_TLS_PORT
  cert_file: $CERTS/server.pem
  key_file: $CERTS/server.key
routes:
  - methods: [POST]
    path: /
    mode: required
EOF
  IDEMD_CONFIG=$WORK/idemd-tls.yaml start_idemd idemd-tls "$IDEM_T_PORT" "$ADMIN_T_PORT" \
    "$(embedded_url "$WORK/store-tls" interval)"
  TLS_PID=$IDEMD_PID
  IDEM_T_URL=https://127.0.0.1:$IDEM_T_TLS_PORT/
  check_key "$IDEM_T_URL" "$RUNID-check-tls"
  write_meta idemd_tls="$(tls_brief "$IDEM_T_TLS_PORT")"
  say "idemd listen_tls :$IDEM_T_TLS_PORT ($(tls_brief "$IDEM_T_TLS_PORT"))"
fi
((FRONT == 1)) && write_meta nginx_tls="$(tls_brief "$FRONT_TLS_PORT")"

if ((HTTPS_IDEMD == 1)); then
  cat >"$WORK/idemd-https.yaml" <<EOF
# bench/run.sh, the https upstream row: every POST needs a key.
upstream_tls:
  ca_file: $CERTS/ca.pem
routes:
  - methods: [POST]
    path: /
    mode: required
EOF
  IDEM_H_URL=http://127.0.0.1:$IDEM_H_PORT/
  HTTPS_SKIPPED=
  if ! IDEMD_MAY_REFUSE=1 IDEMD_CONFIG=$WORK/idemd-https.yaml IDEMD_UPSTREAM=https://127.0.0.1:$TLS_UP_PORT \
    start_idemd idemd-https "$IDEM_H_PORT" "$ADMIN_H_PORT" "$(embedded_url "$WORK/store-https" interval)"; then
    HTTPS_SKIPPED="idemd -t refused upstream: https:// ($IDEMD_REFUSED)"
  else
    HTTPS_PID=$IDEMD_PID
    code=$(http_code POST "$IDEM_H_URL" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: $RUNID-check-https" --data-raw "$BODY")
    if [[ $code != 200 ]]; then
      # A build that takes the configuration but does not speak TLS to the
      # upstream yet answers 502.
      HTTPS_SKIPPED="idemd answered $code through upstream: https:// (want 200)"
      stop_idemd idemd-https "$HTTPS_PID"
      HTTPS_PID=
    else
      check_key "$IDEM_H_URL" "$RUNID-check-https-2"
    fi
  fi
  if [[ -n $HTTPS_SKIPPED ]]; then
    say "note: skipping the row idemd-https-upstream: $HTTPS_SKIPPED"
    write_meta https_upstream_skipped="$HTTPS_SKIPPED"
    HTTPS_IDEMD=0
  fi
fi

# ---- Redis and PostgreSQL --------------------------------------------------------------

# pg_production_settings: what an operator of a busy PostgreSQL sets, and the
# state of a server that has run for a while (bench/README.md, "Issue 20:
# PostgreSQL, second pass"); durability is untouched (fsync, synchronous_commit
# and full_page_writes stay on).  min_wal_size keeps that much WAL in files
# reused at each checkpoint, max_wal_size spaces the checkpoints out; then
# BENCH_PG_WAL_WARM WAL files are written (a row and a switch to the next
# file each) and a CHECKPOINT recycles them, so that the rounds reuse WAL
# files instead of zero-filling new ones (wal_init_zero), which only a new
# cluster does.
pg_production_settings() {
  local psql=(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d idem_test -Atq -v ON_ERROR_STOP=1) i
  {
    "${psql[@]}" -c "ALTER SYSTEM SET min_wal_size = '1GB'" -c "ALTER SYSTEM SET max_wal_size = '4GB'" \
      -c "SELECT pg_reload_conf()" -c "CREATE TABLE IF NOT EXISTS bench_wal_warm (x int)"
    if ((BENCH_PG_WAL_WARM > 0)); then
      say "PostgreSQL: writing and recycling $BENCH_PG_WAL_WARM WAL files"
      for ((i = 0; i < BENCH_PG_WAL_WARM; i++)); do
        printf 'INSERT INTO bench_wal_warm VALUES (%d);\nSELECT pg_switch_wal();\n' "$i"
      done | "${psql[@]}" >/dev/null
    fi
    "${psql[@]}" -c "DROP TABLE bench_wal_warm" -c "CHECKPOINT"
    write_meta pg_settings="$("${psql[@]}" -c "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ' ' ORDER BY name) FROM pg_settings WHERE name IN ('min_wal_size', 'max_wal_size', 'shared_buffers', 'wal_buffers', 'fsync', 'synchronous_commit', 'full_page_writes', 'wal_init_zero', 'wal_recycle')")" \
      pg_wal_files="$(ls "$WORK/services/pg/data/pg_wal" 2>/dev/null | grep -c '^[0-9A-F]\{24\}$' || true)"
  } >>"$WORK/services.log" 2>&1 || die "could not set up PostgreSQL: $(tail -5 "$WORK/services.log")"
}

if [[ $BENCH_SERVER_STORES == 1 ]]; then
  say "starting Redis on :$REDIS_PORT and PostgreSQL on :$PG_PORT (scripts/services.sh)"
  # As root, PostgreSQL runs as the postgres user, who must be able to reach
  # its directory inside this (mode 0700) work directory.
  chmod 711 "$WORK"
  IDEM_TEST_REDIS_PORT=$REDIS_PORT IDEM_TEST_PG_PORT=$PG_PORT \
    timeout 300 bash scripts/services.sh start "$WORK/services" >"$WORK/services.log" 2>&1 ||
    die "could not start Redis and PostgreSQL: $(tail -5 "$WORK/services.log")"
  REDIS_STORE="redis://127.0.0.1:$REDIS_PORT/0"
  PG_STORE="postgres://postgres@127.0.0.1:$PG_PORT/idem_test"
  for url in "$REDIS_STORE" "$PG_STORE"; do
    if ((BENCH_PRELOAD_SERVER > 0)); then
      say "preloading $BENCH_PRELOAD_SERVER keys into $url"
      timeout --kill-after=5 "${BENCH_PRELOAD_TIMEOUT:-1800}" "$PRELOAD_BIN" "$url" \
        "$BENCH_PRELOAD_SERVER" >>"$WORK/preload.log" 2>&1 ||
        die "idem-preload $url failed: $(tail -5 "$WORK/preload.log")"
    fi
  done
  pg_production_settings
  start_idemd idemd-redis "$IDEM_R_PORT" "$ADMIN_R_PORT" "$REDIS_STORE"
  REDIS_PID=$IDEMD_PID
  start_idemd idemd-pg "$IDEM_P_PORT" "$ADMIN_P_PORT" "$PG_STORE"
  PG_PID=$IDEMD_PID
  IDEM_R_URL=http://127.0.0.1:$IDEM_R_PORT/
  IDEM_P_URL=http://127.0.0.1:$IDEM_P_PORT/
  check_key "$IDEM_R_URL" "$RUNID-check-redis"
  check_key "$IDEM_P_URL" "$RUNID-check-pg"
  check_key "$IDEM_R_URL" "$REPLAY_KEY-r"
  check_key "$IDEM_P_URL" "$REPLAY_KEY-p"
  if [[ -n $BASE_PG_IDEMD ]]; then
    IDEMD_BIN=$BASE_PG_IDEMD start_idemd base-pg "$BASE_P_PORT" "$BASE_P_ADMIN" "$PG_STORE"
    BASE_PG_PID=$IDEMD_PID
    BASE_P_URL=http://127.0.0.1:$BASE_P_PORT/
    check_key "$BASE_P_URL" "$RUNID-check-base-pg"
    write_meta base_idemd="$BASE_PG_IDEMD ($("$BASE_PG_IDEMD" --version 2>/dev/null || echo '?'))"
  fi
  if [[ -n $BASE_REDIS_IDEMD ]]; then
    IDEMD_BIN=$BASE_REDIS_IDEMD start_idemd base-redis "$BASE_R_PORT" "$BASE_R_ADMIN" "$REDIS_STORE"
    BASE_REDIS_PID=$IDEMD_PID
    BASE_R_URL=http://127.0.0.1:$BASE_R_PORT/
    check_key "$BASE_R_URL" "$RUNID-check-base-redis"
    write_meta base_idemd="$BASE_REDIS_IDEMD ($("$BASE_REDIS_IDEMD" --version 2>/dev/null || echo '?'))"
  fi
  write_meta redis_store="$REDIS_STORE" pg_store="$PG_STORE" preload_server="$BENCH_PRELOAD_SERVER"
fi

# ---- Redis over TLS and Redis Cluster (issue 20) ---------------------------------------
#
# Each with an idemd of its own, as the plain Redis row; preloaded like it.

# preload_server URL: BENCH_PRELOAD_SERVER completed keys into URL's store.
preload_server() {
  ((BENCH_PRELOAD_SERVER > 0)) || return 0
  say "preloading $BENCH_PRELOAD_SERVER keys into $1"
  timeout --kill-after=5 "${BENCH_PRELOAD_TIMEOUT:-1800}" "$PRELOAD_BIN" "$1" \
    "$BENCH_PRELOAD_SERVER" >>"$WORK/preload.log" 2>&1 ||
    die "idem-preload $1 failed: $(tail -5 "$WORK/preload.log")"
}

if ((REDISS == 1)); then
  mkdir -p "$WORK/rediss"
  redis-server --bind 127.0.0.1 --port 0 --tls-port "$REDISS_PORT" --tls-cert-file "$CERTS/server.pem" \
    --tls-key-file "$CERTS/server.key" --tls-ca-cert-file "$CERTS/ca.pem" --tls-auth-clients no \
    --save '' --appendonly no --dir "$WORK/rediss" --logfile "$WORK/rediss/redis.log" \
    </dev/null >/dev/null 2>&1 &
  REDISS_SERVER_PID=$!
  PIDS+=("$REDISS_SERVER_PID")
  for ((i = 0; i < 300; i++)); do
    [[ $(timeout 5 redis-cli --tls --cacert "$CERTS/ca.pem" -h 127.0.0.1 -p "$REDISS_PORT" ping 2>/dev/null) == PONG ]] &&
      break
    kill -0 "$REDISS_SERVER_PID" 2>/dev/null || i=300
    sleep 0.1
  done
  ((i < 300)) || die "the TLS Redis did not start: $(tail -5 "$WORK/rediss/redis.log")"
  REDISS_STORE="rediss://127.0.0.1:$REDISS_PORT/0?ca=$CERTS/ca.pem"
  preload_server "$REDISS_STORE"
  start_idemd idemd-rediss "$IDEM_RS_PORT" "$ADMIN_RS_PORT" "$REDISS_STORE"
  RS_PID=$IDEMD_PID
  IDEM_RS_URL=http://127.0.0.1:$IDEM_RS_PORT/
  check_key "$IDEM_RS_URL" "$RUNID-check-rediss"
  write_meta rediss_store="$REDISS_STORE" rediss_tls="$(tls_brief "$REDISS_PORT")"
  say "Redis over TLS on :$REDISS_PORT ($(tls_brief "$REDISS_PORT"))"
fi

# start_cluster DIR REPLICAS: a Redis Cluster of 3 masters with REPLICAS
# replicas each, tests/cluster.py's Cluster, held by a Python process until
# it gets SIGTERM (stop_pid, in the EXIT trap too), which stops every node.
# Sets CL_SEEDS (the masters, "host:port" joined by commas: the URL's
# seeds), CL_NODES (every node, likewise), CL_MASTER_PIDS and
# CL_REPLICA_PIDS (space-separated).
start_cluster() {
  local dir=$1 replicas=$2 holder i
  python3 - "$ROOT/tests" "$dir" "$dir.info" "$replicas" >"$dir.log" 2>&1 <<'PY' &
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import cluster
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
c = cluster.Cluster(sys.argv[2], masters=3, replicas=int(sys.argv[4]))
try:
    c.start()
    masters = set(c.masters())
    ms = [n for n in c.nodes if n.port in masters]
    rs = [n for n in c.nodes if n.port not in masters]
    with open(sys.argv[3] + ".tmp", "w") as f:
        f.write(",".join("%s:%d" % (cluster.HOST, n.port) for n in ms) + "\n")
        f.write(",".join("%s:%d" % (cluster.HOST, n.port) for n in c.nodes) + "\n")
        f.write(" ".join(str(n.proc.pid) for n in ms) + "\n")
        f.write(" ".join(str(n.proc.pid) for n in rs) + "\n")
    os.rename(sys.argv[3] + ".tmp", sys.argv[3])
    while True:
        signal.pause()
finally:
    c.stop()
PY
  holder=$!
  PIDS+=("$holder")
  for ((i = 0; i < 1200; i++)); do
    [[ -f $dir.info ]] && break
    kill -0 "$holder" 2>/dev/null || die "the Redis Cluster did not start: $(tail -5 "$dir.log")"
    sleep 0.1
  done
  [[ -f $dir.info ]] || die "the Redis Cluster did not start in 120s"
  { read -r CL_SEEDS; read -r CL_NODES; read -r CL_MASTER_PIDS; read -r CL_REPLICA_PIDS || true; } <"$dir.info"
}

if ((RCLUSTER == 1)); then
  # The row compared with one master: three masters, no replica (like for like).
  start_cluster "$WORK/cluster" 0
  CLUSTER_SEEDS=$CL_SEEDS CLUSTER_NODES=$CL_NODES CLUSTER_NODE_PIDS=$CL_MASTER_PIDS
  RCLUSTER_STORE="redis+cluster://$CLUSTER_SEEDS"
  preload_server "$RCLUSTER_STORE"
  start_idemd idemd-redis-cluster "$IDEM_RC_PORT" "$ADMIN_RC_PORT" "$RCLUSTER_STORE"
  RC_PID=$IDEMD_PID
  IDEM_RC_URL=http://127.0.0.1:$IDEM_RC_PORT/
  check_key "$IDEM_RC_URL" "$RUNID-check-cluster"
  if [[ -n $BASE_RC_IDEMD ]]; then
    IDEMD_BIN=$BASE_RC_IDEMD start_idemd base-redis-cluster "$BASE_RC_PORT" "$BASE_RC_ADMIN" "$RCLUSTER_STORE"
    BASE_RC_PID=$IDEMD_PID
    BASE_RC_URL=http://127.0.0.1:$BASE_RC_PORT/
    check_key "$BASE_RC_URL" "$RUNID-check-base-cluster"
  fi
  write_meta redis_cluster_store="$RCLUSTER_STORE" redis_cluster_pids="$CLUSTER_NODE_PIDS"
  say "Redis Cluster, 3 masters (no replicas), seeds $CLUSTER_SEEDS"
fi
if ((RCLUSTER_REPL == 1)); then
  # The same with a replica per master: the cost of replication, apart.
  start_cluster "$WORK/cluster-r" 1
  CLUSTER_R_NODES=$CL_NODES CLUSTER_R_MASTER_PIDS=$CL_MASTER_PIDS CLUSTER_R_REPLICA_PIDS=$CL_REPLICA_PIDS
  RCLUSTER_R_STORE="redis+cluster://$CL_SEEDS"
  preload_server "$RCLUSTER_R_STORE"
  start_idemd idemd-redis-cluster-r "$IDEM_RCR_PORT" "$ADMIN_RCR_PORT" "$RCLUSTER_R_STORE"
  RCR_PID=$IDEMD_PID
  IDEM_RCR_URL=http://127.0.0.1:$IDEM_RCR_PORT/
  check_key "$IDEM_RCR_URL" "$RUNID-check-cluster-r"
  write_meta redis_cluster_replicas_store="$RCLUSTER_R_STORE" \
    redis_cluster_replicas_master_pids="$CLUSTER_R_MASTER_PIDS" \
    redis_cluster_replicas_replica_pids="$CLUSTER_R_REPLICA_PIDS"
  say "Redis Cluster, 3 masters + 3 replicas, seeds $CL_SEEDS"
fi

# ---- express-idempotency ----------------------------------------------------------------

if [[ $BENCH_EXPRESS == 1 ]]; then
  EXPRESS_DIR=$ROOT/bench/express
  # npm ci (exactly package-lock.json) when node_modules is missing or older
  # than the lock file; npm records what it installed in .package-lock.json.
  if [[ ! -f $EXPRESS_DIR/node_modules/.package-lock.json ||
        $EXPRESS_DIR/package-lock.json -nt $EXPRESS_DIR/node_modules/.package-lock.json ]]; then
    say "installing bench/express's dependencies (npm ci)"
    (cd "$EXPRESS_DIR" && timeout 600 npm ci --no-audit --no-fund) >"$WORK/npm-ci.log" 2>&1 ||
      die "npm ci in bench/express failed: $(tail -5 "$WORK/npm-ci.log")"
  fi
  EXPRESS_URL=http://127.0.0.1:$EXPRESS_PORT/
  NODE_ENV=production node "$EXPRESS_DIR/app.js" --listen "$EXPRESS_PORT" --upstream "$UP_URL" \
    --adapter "$BENCH_EXPRESS_ADAPTER" 2>"$WORK/express.log" &
  EXPRESS_PID=$!
  PIDS+=("$EXPRESS_PID")
  wait_http "${EXPRESS_URL}metrics" "$EXPRESS_PID" 30 ||
    die "the Express app did not start: $(tail -5 "$WORK/express.log")"
  # The middleware marks no replay in its answer: check with its counters
  # that a first POST was forwarded and the second was a replay.
  for k in "$RUNID-check-express" "$RUNID-check-express" "$REPLAY_KEY-x"; do
    code=$(http_code POST "$EXPRESS_URL" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: $k" --data-raw "$BODY")
    [[ $code == 200 ]] || die "the Express app answered $code to a POST with key $k (want 200)"
  done
  grep -qx 'idem_requests_total{outcome="new"} 2' <(curl -s --max-time 5 "${EXPRESS_URL}metrics") &&
    grep -qx 'idem_requests_total{outcome="replay"} 1' <(curl -s --max-time 5 "${EXPRESS_URL}metrics") ||
    die "the Express app did not replay a repeated key: $(curl -s --max-time 5 "${EXPRESS_URL}metrics" | tr '\n' ' ')"
  write_meta node="$(node --version)" \
    express="$(node -p 'require(process.argv[1]).version' "$EXPRESS_DIR/node_modules/express/package.json")" \
    express_idempotency="$(node -p 'require(process.argv[1]).version' \
      "$EXPRESS_DIR/node_modules/express-idempotency/package.json")" \
    express_adapter="$BENCH_EXPRESS_ADAPTER"
  say "Express app (express-idempotency, adapter $BENCH_EXPRESS_ADAPTER) on :$EXPRESS_PORT"
fi

# ---- idemd at one worker and at workers: auto (issue 22) -----------------------------
#
# Each on a fresh LMDB store of its own, sync=interval: the CPU-bound
# new-key path, so that what more workers buy (or cost) shows in req/s and
# CPU per request.  BENCH_WORKERS does not apply to these two.

W1_PID= WA_PID=
if want_row idemd-workers-1; then
  BENCH_WORKERS=1 start_idemd idemd-workers-1 "$IDEM_W1_PORT" "$ADMIN_W1_PORT" \
    "lmdb:$WORK/store-w1?sync=interval&map_size=$BENCH_MAP_SIZE"
  W1_PID=$IDEMD_PID
  check_key "http://127.0.0.1:$IDEM_W1_PORT/" "$RUNID-check-w1"
fi
if want_row idemd-workers-auto; then
  BENCH_WORKERS=auto start_idemd idemd-workers-auto "$IDEM_WA_PORT" "$ADMIN_WA_PORT" \
    "lmdb:$WORK/store-wa?sync=interval&map_size=$BENCH_MAP_SIZE"
  WA_PID=$IDEMD_PID
  check_key "http://127.0.0.1:$IDEM_WA_PORT/" "$RUNID-check-wa"
  wa_workers=$(curl -s --max-time 5 "http://127.0.0.1:$ADMIN_WA_PORT/metrics" | awk '$1 == "idem_workers" { print $2 }')
  write_meta workers_auto="${wa_workers:-?}"
  say "idemd --workers auto: ${wa_workers:-?} worker(s) on $(nproc) CPU(s)"
fi

# ---- the rounds ----------------------------------------------------------------------

for ((r = 1; r <= BENCH_ROUNDS; r++)); do
  want_row nginx-direct && measure nginx-direct "$r" "$UP_URL" unique "$RUNID-d$r"
  want_row nginx-proxy && measure nginx-proxy "$r" "$PROXY_URL" unique "$RUNID-p$r"
  want_row idemd-new-always && measure idemd-new-always "$r" "$IDEM_A_URL" unique "$RUNID-a$r" "$ADMIN_A_URL"
  want_row idemd-new-interval && measure idemd-new-interval "$r" "$IDEM_I_URL" unique "$RUNID-i$r" "$ADMIN_I_URL"
  want_row idemd-replay && measure idemd-replay "$r" "$IDEM_A_URL" fixed "$REPLAY_KEY" "$ADMIN_A_URL"
  if [[ -n $BASE_IDEMD ]]; then
    want_row base-new-always &&
      measure base-new-always "$r" "$BASE_A_URL" unique "$RUNID-ba$r" "http://127.0.0.1:$BASE_A_ADMIN"
    want_row base-new-interval &&
      measure base-new-interval "$r" "$BASE_I_URL" unique "$RUNID-bi$r" "http://127.0.0.1:$BASE_I_ADMIN"
    want_row base-replay &&
      measure base-replay "$r" "$BASE_A_URL" fixed "$REPLAY_KEY" "http://127.0.0.1:$BASE_A_ADMIN"
  fi
  if [[ $BENCH_SERVER_STORES == 1 ]]; then
    want_row idemd-new-redis &&
      measure idemd-new-redis "$r" "$IDEM_R_URL" unique "$RUNID-r$r" "http://127.0.0.1:$ADMIN_R_PORT"
    want_row idemd-replay-redis &&
      measure idemd-replay-redis "$r" "$IDEM_R_URL" fixed "$REPLAY_KEY-r" "http://127.0.0.1:$ADMIN_R_PORT"
    want_row idemd-new-pg &&
      measure idemd-new-pg "$r" "$IDEM_P_URL" unique "$RUNID-g$r" "http://127.0.0.1:$ADMIN_P_PORT"
    want_row idemd-replay-pg &&
      measure idemd-replay-pg "$r" "$IDEM_P_URL" fixed "$REPLAY_KEY-p" "http://127.0.0.1:$ADMIN_P_PORT"
    [[ -n $BASE_PG_IDEMD ]] &&
      measure base-new-pg "$r" "$BASE_P_URL" unique "$RUNID-bg$r" "http://127.0.0.1:$BASE_P_ADMIN"
    [[ -n $BASE_REDIS_IDEMD ]] &&
      measure base-new-redis "$r" "$BASE_R_URL" unique "$RUNID-br$r" "http://127.0.0.1:$BASE_R_ADMIN"
  fi
  ((REDISS == 1)) &&
    measure idemd-new-rediss "$r" "$IDEM_RS_URL" unique "$RUNID-rs$r" "http://127.0.0.1:$ADMIN_RS_PORT"
  ((RCLUSTER == 1)) && want_row idemd-new-redis-cluster &&
    measure idemd-new-redis-cluster "$r" "$IDEM_RC_URL" unique "$RUNID-rc$r" "http://127.0.0.1:$ADMIN_RC_PORT"
  ((RCLUSTER_REPL == 1)) &&
    measure idemd-new-redis-cluster-replicas "$r" "$IDEM_RCR_URL" unique "$RUNID-rcr$r" \
      "http://127.0.0.1:$ADMIN_RCR_PORT"
  [[ -n $BASE_RC_IDEMD ]] &&
    measure base-new-redis-cluster "$r" "$BASE_RC_URL" unique "$RUNID-brc$r" "http://127.0.0.1:$BASE_RC_ADMIN"
  if [[ $BENCH_EXPRESS == 1 ]]; then
    want_row express-new && measure express-new "$r" "$EXPRESS_URL" unique "$RUNID-x$r" "${EXPRESS_URL%/}"
    want_row express-replay && measure express-replay "$r" "$EXPRESS_URL" fixed "$REPLAY_KEY-x" "${EXPRESS_URL%/}"
  fi
  want_row idemd-workers-1 &&
    measure idemd-workers-1 "$r" "http://127.0.0.1:$IDEM_W1_PORT/" unique "$RUNID-w1$r" "http://127.0.0.1:$ADMIN_W1_PORT"
  want_row idemd-workers-auto &&
    measure idemd-workers-auto "$r" "http://127.0.0.1:$IDEM_WA_PORT/" unique "$RUNID-wa$r" "http://127.0.0.1:$ADMIN_WA_PORT"
  want_row nginx-tls-listener && measure nginx-tls-listener "$r" "$FRONT_TLS_URL" unique "$RUNID-nt$r"
  ((TLS_IDEMD == 1)) && want_row idemd-tls-listener &&
    measure idemd-tls-listener "$r" "$IDEM_T_URL" unique "$RUNID-t$r" "http://127.0.0.1:$ADMIN_T_PORT"
  want_row nginx-https-upstream && measure nginx-https-upstream "$r" "$FRONT_HTTPS_URL" unique "$RUNID-nh$r"
  ((HTTPS_IDEMD == 1)) &&
    measure idemd-https-upstream "$r" "$IDEM_H_URL" unique "$RUNID-h$r" "http://127.0.0.1:$ADMIN_H_PORT"
  if want_row tls-handshakes; then
    handshakes handshakes-nginx "$r" "$FRONT_TLS_PORT" "$FRONT_WORKER"
    handshakes handshakes-idemd "$r" "$IDEM_T_TLS_PORT" "$TLS_PID"
  fi
done

if [[ $BENCH_PROFILE == 1 ]]; then
  profile idemd-new-always "$IDEM_A_URL" unique "$RUNID-a" "$ALWAYS_PID"
  profile idemd-new-interval "$IDEM_I_URL" unique "$RUNID-i" "$INTERVAL_PID"
  profile idemd-replay "$IDEM_A_URL" fixed "$REPLAY_KEY" "$ALWAYS_PID"
fi

if ((EMBEDDED_ROWS == 1)); then
  stop_idemd idemd-always "$ALWAYS_PID"
  stop_idemd idemd-interval "$INTERVAL_PID"
fi
if [[ -n $BASE_IDEMD ]]; then
  stop_idemd base-always "$BASE_ALWAYS_PID"
  stop_idemd base-interval "$BASE_INTERVAL_PID"
fi
((TLS_IDEMD == 1)) && stop_idemd idemd-tls "$TLS_PID"
((HTTPS_IDEMD == 1)) && stop_idemd idemd-https "$HTTPS_PID"
if [[ $BENCH_SERVER_STORES == 1 ]]; then
  stop_idemd idemd-redis "$REDIS_PID"
  stop_idemd idemd-pg "$PG_PID"
  [[ -n $BASE_PG_IDEMD ]] && stop_idemd base-pg "$BASE_PG_PID"
  [[ -n $BASE_REDIS_IDEMD ]] && stop_idemd base-redis "$BASE_REDIS_PID"
fi
((REDISS == 1)) && stop_idemd idemd-rediss "$RS_PID"
((RCLUSTER == 1)) && stop_idemd idemd-redis-cluster "$RC_PID"
((RCLUSTER_REPL == 1)) && stop_idemd idemd-redis-cluster-r "$RCR_PID"
[[ -n $BASE_RC_IDEMD ]] && stop_idemd base-redis-cluster "$BASE_RC_PID"
if [[ $BENCH_EXPRESS == 1 ]]; then
  # Its memory at the end: the in-memory store holds every key of the run.
  write_meta express_rss_kib="$(awk '/^VmRSS:/ {print $2}' "/proc/$EXPRESS_PID/status" 2>/dev/null || echo 0)"
  stop_pid "$EXPRESS_PID"
  forget_pid "$EXPRESS_PID"
fi

# ---- the steady state ------------------------------------------------------------------
#
# After the rounds and with every other idemd stopped, so that nothing else
# competes with it: one idemd on a fresh embedded store (sync=interval: new
# keys at full speed, not at the disk's flush rate) with key_ttl
# BENCH_STEADY_TTL, one wrk run of BENCH_STEADY_SECONDS, and a sample every
# 10 s (and one when wrk ends) into $WORK/idemd-steady.samples, one line each:
#   elapsed seconds, bytes allocated on disk (du -B1 of the store directory:
#   blocks, so a sparse file counts what it uses), its apparent size (du -b),
#   idem_requests_total{outcome="new"} (over every route), idem_store_swept_total, the sum of
#   idem_requests_total over outcomes (requests answered), idemd's VmRSS in KiB.
# Records in the store are about new - swept (a key that was never completed
# expires too, and is swept as one).  report.py judges the samples.

# steady_sample ELAPSED: one line of samples (and a line for the user).
steady_sample() {
  local t=$1 alloc apparent m new swept answered rss
  alloc=$(du -s -B1 "$STEADY_DIR" 2>/dev/null | cut -f1) || alloc=0
  apparent=$(du -s -b "$STEADY_DIR" 2>/dev/null | cut -f1) || apparent=0
  m=$(curl -sf --max-time 5 "$STEADY_ADMIN/metrics") ||
    die "idemd-steady: cannot read $STEADY_ADMIN/metrics at ${t}s (did idemd die?)"
  read -r new swept answered < <(awk '
    $1 ~ /^idem_requests_total\{outcome="new"[,}]/ { n += $2 }
    $1 == "idem_store_swept_total" { s = $2 }
    $1 ~ /^idem_requests_total\{/ { a += $2 }
    END { printf "%d %d %d\n", n, s, a }' <<<"$m")
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$STEADY_PID/status" 2>/dev/null || echo 0)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${alloc:-0}" "${apparent:-0}" "$new" "$swept" \
    "$answered" "${rss:-0}" >>"$WORK/idemd-steady.samples"
  say "steady $(printf '%6ss' "$t")  on disk $((${alloc:-0} / 1024)) KiB, records ~$((new - swept))" \
    "(new $new, swept $swept), answered $answered, RSS $((${rss:-0} / 1024)) MiB"
}

if ((STEADY == 1)); then
  STEADY_DIR=$WORK/store-steady
  STEADY_URL=http://127.0.0.1:$IDEM_S_PORT/
  STEADY_ADMIN=http://127.0.0.1:$ADMIN_S_PORT
  cat >"$WORK/idemd-steady.yaml" <<EOF
# bench/run.sh, the steady-state row: every POST needs a key, kept $BENCH_STEADY_TTL.
defaults:
  key_ttl: $BENCH_STEADY_TTL
routes:
  - methods: [POST]
    path: /
    mode: required
EOF
  IDEMD_CONFIG=$WORK/idemd-steady.yaml start_idemd idemd-steady "$IDEM_S_PORT" "$ADMIN_S_PORT" \
    "$(embedded_url "$STEADY_DIR" interval)"
  STEADY_PID=$IDEMD_PID
  check_key "$STEADY_URL" "$RUNID-check-steady"
  write_meta steady_store="$(embedded_url "<dir>" interval)"
  say "steady state: $BENCH_EMBEDDED sync=interval, fresh store, key_ttl $BENCH_STEADY_TTL," \
    "wrk -c$BENCH_CONNECTIONS for ${BENCH_STEADY_SECONDS}s, a sample every 10 s"
  printf 'seconds\tbytes_on_disk\tbytes_apparent\tnew\tswept\tanswered\trss_kib\n' \
    >"$WORK/idemd-steady.samples"
  # timeout itself in the background (not wrk_cmd's subshell), so that the
  # EXIT trap's SIGTERM reaches it and it passes the signal on to wrk.
  timeout --kill-after=5 $((BENCH_STEADY_SECONDS + 60)) \
    wrk -t"$BENCH_THREADS" -c"$BENCH_CONNECTIONS" -d"${BENCH_STEADY_SECONDS}s" --timeout 10s --latency \
    -s "$LUA" "$STEADY_URL" -- unique "$RUNID-s" >"$WORK/idemd-steady.wrk" 2>&1 &
  steady_wrk=$!
  PIDS+=("$steady_wrk")
  t0=${EPOCHREALTIME/./}
  steady_sample 0
  for ((k = 1; k * 10 < BENCH_STEADY_SECONDS; k++)); do
    # Sleep to the next 10 s mark (µs since t0), or stop if wrk ended early.
    while :; do
      kill -0 "$steady_wrk" 2>/dev/null || break 2
      left=$((t0 + k * 10000000 - ${EPOCHREALTIME/./}))
      ((left > 0)) || break
      ((left > 500000)) && left=500000
      sleep "$(printf '0.%06d' "$left")"
    done
    steady_sample $((k * 10))
  done
  rc=0
  wait "$steady_wrk" || rc=$?
  forget_pid "$steady_wrk"
  ((rc == 0)) || die "idemd-steady: wrk failed (status $rc): $(tail -3 "$WORK/idemd-steady.wrk")"
  now=${EPOCHREALTIME/./}
  steady_sample "$(( (now - t0) / 1000000 )).$(( (now - t0) / 100000 % 10 ))"
  stop_idemd idemd-steady "$STEADY_PID"
fi

# ---- HTTP/2 (issue 23): bench/h2.sh, with servers of its own ----------------------------

if want_row http2; then
  say "http2: bench/h2.sh, $BENCH_ROUNDS rounds of 8 rows"
  TMPDIR=$WORK IDEMD=$IDEM_BUILD/idemd H2KEYS=$IDEM_BUILD/bench/idem-h2keys \
    BENCH_H2_SECONDS=$BENCH_SECONDS BENCH_H2_CLIENTS=$BENCH_CONNECTIONS BENCH_H2_ROUNDS=$BENCH_ROUNDS \
    timeout $((BENCH_ROUNDS * 8 * (BENCH_SECONDS + 4) + 120)) bash bench/h2.sh \
    >"$WORK/h2.md" 2>"$WORK/h2.err" || die "http2: bench/h2.sh failed: $(tail -3 "$WORK/h2.err")"
fi

# ---- the report ------------------------------------------------------------------------

mkdir -p "$BENCH_RESULTS"
for f in "$WORK"/*.profile.txt "$WORK"/*.idemd.log; do
  [[ -f $f ]] || continue
  case $f in
    *.profile.txt) cp "$f" "$BENCH_RESULTS/$(basename "$f" .profile.txt)-$RUNID.profile.txt" ;;
    *.idemd.log) gzip -c "$f" >"$BENCH_RESULTS/$(basename "$f")-$RUNID.gz" ;;
  esac
done
report_rc=0
python3 bench/report.py "$WORK" "$BENCH_RESULTS" || report_rc=$?
if [[ -s $WORK/h2.md ]]; then
  printf '\nHTTP/2 (bench/h2.sh, issue 23):\n'
  cat "$WORK/h2.md"
  cp "$WORK/h2.md" "$BENCH_RESULTS/h2-$RUNID.md"
  [[ $BENCH_STRICT == 1 ]] && grep -q MISSED "$WORK/h2.md" && report_rc=1
fi
exit "$report_rc"
