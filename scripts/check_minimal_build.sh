#!/usr/bin/env bash
# scripts/check_minimal_build.sh - idem built with its embedded store only.
#
# The RocksDB, Redis, PostgreSQL and SQLite parts are meson features
# (meson_options.txt): a machine with only LMDB, libuv, OpenSSL, jansson,
# libyaml and libcurl builds libidem, idemd and idemctl.  This configures a
# temporary tree with those four parts disabled (what such a machine gets
# from `auto`), builds the library and the two programs, and checks what a
# user of that build sees:
#   - idemd runs on lmdb: and on memory: (`idemd -t`);
#   - a rocksdb:, redis://, redis+sentinel://, postgres:// or postgresql:// store URL
#     is refused at start with exit status 2 and one line naming the part
#     that was left out;
#   - libidem still exports idem_tx_sqlite and idem_tx_postgres (they
#     answer IDEM_E_UNSUPPORTED), so every build has the same symbols;
#   - libidem.so and libidem.a export the IDEM_EXTERN declarations of
#     include/idem/ and nothing else (scripts/check_exports.py, as the lint
#     test 'exports' checks the full build).
# Prints "ok - ..." or "FAIL - ..." per check and ends "N passed, N failed".
# Usage: scripts/check_minimal_build.sh      (a meson test of suite 'lint')
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/idem-minimal.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }

if meson setup "$tmp/b" "$root" --buildtype=debug -Dtests=disabled -Drocksdb=disabled -Dredis=disabled \
     -Dpostgres=disabled -Dsqlite=disabled >"$tmp/setup.log" 2>&1; then
  ok "configured with rocksdb, redis, postgres and sqlite disabled"
else
  cat "$tmp/setup.log"
  fail "meson setup with the optional parts disabled"
  finish
fi
if ninja -C "$tmp/b" idemd idemctl libidem.so.0.1.0 libidem.a >"$tmp/build.log" 2>&1; then
  ok "built idemd, idemctl, libidem.so and libidem.a without librocksdb, hiredis, libpq and sqlite3"
else
  tail -40 "$tmp/build.log"
  fail "the build without the optional parts"
  finish
fi

idemd=$tmp/b/idemd
for url in "lmdb:$tmp/data" "memory:"; do
  if "$idemd" -t --store "$url" >"$tmp/out" 2>&1; then
    ok "idemd -t --store $url"
  else
    fail "idemd -t --store $url: $(cat "$tmp/out")"
  fi
done
for url in "rocksdb:$tmp/rocks" redis://127.0.0.1:6379/0 redis+sentinel://127.0.0.1:26379/m \
           postgres://idem@127.0.0.1/idem postgresql://idem@127.0.0.1/idem; do
  timeout 20 "$idemd" --store "$url" --listen 127.0.0.1:1 --admin 127.0.0.1:2 >"$tmp/out" 2>&1
  rc=$?
  lines=$(wc -l <"$tmp/out")
  case $url in *://*) scheme=${url%%://*}:// ;; *) scheme=${url%%:*}: ;; esac
  if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF "$scheme URLs need the" "$tmp/out" &&
     grep -q "^idemd: " "$tmp/out" && grep -q "left out" "$tmp/out"; then
    ok "--store $scheme refused at start: exit 2, one line"
  else
    fail "--store $url: exit $rc, $lines lines: $(cat "$tmp/out")"
  fi
done
if [ -n "$(ldd "$idemd" | grep -E 'librocksdb|libhiredis|libpq|libsqlite3')" ]; then
  fail "idemd links a library of a part that was left out: $(ldd "$idemd" | grep -E 'rocksdb|hiredis|pq|sqlite')"
else
  ok "idemd links none of librocksdb, hiredis, libpq, sqlite3"
fi
syms=$(nm -D --defined-only "$tmp/b/libidem.so" 2>/dev/null)
for s in idem_tx_sqlite idem_tx_postgres idem_store_open; do
  if grep -q " T $s\$" <<<"$syms"; then ok "libidem.so exports $s"; else fail "libidem.so lacks $s"; fi
done
if python3 "$root/scripts/check_exports.py" "$tmp/b" >"$tmp/exports" 2>&1; then
  ok "libidem.so and libidem.a export only the IDEM_EXTERN API ($(grep -c '^ok' "$tmp/exports") checks)"
else
  sed 's/^/    /' "$tmp/exports"
  fail "libidem's exports (scripts/check_exports.py) in the build without the optional parts"
fi
finish
