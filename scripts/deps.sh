#!/usr/bin/env bash
# scripts/deps.sh - install the Debian packages idem needs, if missing.
#
# Called by every Makefile target, so `make run` and `make test` work on a
# fresh Debian 12 machine.  Runs apt-get only when a package is missing
# (uses sudo when not root).  Usage: scripts/deps.sh [build|test|bench]
set -euo pipefail

build_pkgs=(gcc make meson ninja-build pkg-config libuv1-dev liblmdb-dev libssl-dev
            libjansson-dev libyaml-dev libcurl4-openssl-dev libhiredis-dev libpq-dev libsqlite3-dev curl python3)
test_pkgs=(libcriterion-dev clang libclang-rt-14-dev lmdb-utils redis-server postgresql sqlite3)
bench_pkgs=(nginx wrk linux-perf valgrind nodejs $(command -v npm >/dev/null || echo npm))  # npm: a nodejs that bundles it (and conflicts with Debian's) counts

want=("${build_pkgs[@]}")
case "${1:-build}" in
  test) want+=("${test_pkgs[@]}") ;;
  bench) want+=("${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
