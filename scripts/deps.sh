#!/usr/bin/env bash
# scripts/deps.sh - install the Debian packages idem needs, if missing.
#
# Called by every Makefile target, so `make run` and `make test` work on a
# fresh Debian 12 machine.  Runs apt-get only when a package is missing
# (uses sudo when not root).  Usage: scripts/deps.sh [build|test|bench|deb]
#
#   build  what building and running idemd, idemctl and libidem needs, with
#          every store backend (`make build`, `make run`): no test tools
#   test   build, plus Criterion, clang for the fuzzers, the Redis and
#          PostgreSQL servers the tests start, and deb's tools (`make test`)
#   bench  test, plus nginx, wrk, h2load (nghttp2-client), perf and Node.js (`make bench`)
#   deb    build, plus Debian's packaging tools (`make deb`)
#
# apt-get's own messages are shown as they come; a step that fails stops
# here with a line naming it.
set -euo pipefail

build_pkgs=(gcc libc6-dev make meson ninja-build pkg-config libuv1-dev liblmdb-dev librocksdb-dev libssl-dev
            libjansson-dev libyaml-dev libcurl4-openssl-dev libhiredis-dev libpq-dev libsqlite3-dev curl
            libnghttp2-dev)  # HTTP/2 on the public listener (src/gateway/h2conn.c)
test_pkgs=(python3 libcriterion-dev clang libclang-rt-14-dev lmdb-utils redis-server postgresql sqlite3
           openssl python3-h2)  # openssl: tests/certs.py makes the TLS tests' certificates;
                                # python3-h2: tests/blackbox/test_http2.py's client
# make deb and scripts/check_deb.sh: Debian's packaging tools (dpkg-buildpackage
# also wants build-essential, whatever debian/control says), scdoc for the
# manual pages, systemd for systemd-analyze verify, man-db/groff to render.
deb_pkgs=(build-essential debhelper dpkg-dev fakeroot lintian scdoc systemd man-db groff-base procps)
bench_pkgs=(nginx wrk nghttp2-client linux-perf valgrind nodejs $(command -v npm >/dev/null || echo npm))  # npm: a nodejs that bundles it (and conflicts with Debian's) counts

want=("${build_pkgs[@]}")
case "${1:-build}" in
  test) want+=("${test_pkgs[@]}" "${deb_pkgs[@]}") ;;  # make test builds the packages too
  bench) want+=("${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
  deb) want+=("${deb_pkgs[@]}") ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "deps: missing Debian packages: ${missing[*]}; run as root, or install sudo" >&2
    exit 1
  fi
  SUDO=(sudo)
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
  || { echo "deps: apt-get update failed (its message is above)" >&2; exit 1; }
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >&2 \
  || { echo "deps: apt-get install failed (its message is above)" >&2; exit 1; }
