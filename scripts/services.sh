#!/usr/bin/env bash
# scripts/services.sh - the Redis and PostgreSQL servers the tests need, on
# loopback ports, in temporary directories.
#
#   scripts/services.sh start DIR   start both under DIR (made if missing); prints
#                                   the env lines to use them (also in DIR/env)
#   scripts/services.sh stop DIR    stop both, remove DIR
#   scripts/services.sh status DIR  exit 0 when both answer
#
# Ports: IDEM_TEST_REDIS_PORT (default 6391), IDEM_TEST_PG_PORT (default 5441).
# PostgreSQL refuses to run as root, so as root the cluster runs as the
# `postgres` user that Debian's package creates.  Nothing is written outside
# DIR; the servers listen on 127.0.0.1 only and keep no data after stop.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }

redis_port=${IDEM_TEST_REDIS_PORT:-6391}
pg_port=${IDEM_TEST_PG_PORT:-5441}
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
  mkdir -p "$dir/redis" "$dir/pg"
  dir=$(cd "$dir" && pwd)
  # Redis: no persistence (tests that need AOF start their own server).
  redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$dir/redis" --save "" \
    --appendonly no --daemonize yes --pidfile "$dir/redis/redis.pid" \
    --logfile "$dir/redis/redis.log" >/dev/null
  # PostgreSQL: a fresh cluster; fsync stays on (durability is what we test).
  if [ "$(id -u)" -eq 0 ]; then chown -R postgres: "$dir/pg"; chmod 755 "$dir"; fi
  as_pg "$pg_bin/initdb" -D "$dir/pg/data" -U postgres -A trust --no-sync >/dev/null
  as_pg "$pg_bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $dir/pg -c max_connections=200" start >/dev/null
  as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres idem_test
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  cat > "$dir/env" <<EOF
export IDEM_TEST_REDIS_URL=redis://127.0.0.1:$redis_port/0
export IDEM_TEST_PG_URL=postgres://postgres@127.0.0.1:$pg_port/idem_test
EOF
  cat "$dir/env"
}

stop() {
  [ -d "$dir" ] || return 0
  # Redis by its own pid file, never by port: a `stop` run without the
  # IDEM_TEST_REDIS_PORT its `start` had must not shut down whatever server
  # listens on the default port (another run's).
  if [ -f "$dir/redis/redis.pid" ]; then
    pid=$(cat "$dir/redis/redis.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -f "$dir/pg/data/postmaster.pid" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$dir/pg/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

status() {
  redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null | grep -q PONG &&
    "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status DIR" >&2; exit 2 ;;
esac
