#!/usr/bin/env bash
# scripts/check_release_build.sh - idem builds as `--buildtype=release`.
#
# The test trees are debugoptimized (-O2) and sanitized; a user or a
# packager who configures `meson setup build --buildtype=release` gets -O3,
# where GCC inlines further and warns of things -O2 does not see (a value
# "may be used uninitialized" across an inlined parser), and warnings are
# errors.  This configures a temporary release tree with every part the
# machine has (tests disabled) and builds all of it.
# Prints "ok - ..." or "FAIL - ..." and ends "N passed, N failed".
# Usage: scripts/check_release_build.sh      (a meson test of suite 'lint')
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/idem-release.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! meson setup "$tmp/b" "$root" --buildtype=release -Dtests=disabled >"$tmp/setup.log" 2>&1; then
  cat "$tmp/setup.log"
  echo "FAIL - meson setup --buildtype=release"
  echo "0 passed, 1 failed"
  exit 1
fi
if ninja -C "$tmp/b" >"$tmp/build.log" 2>&1; then
  echo "ok - built everything with --buildtype=release (-O3, warnings are errors)"
  echo "1 passed, 0 failed"
  exit 0
fi
grep -E 'error:|FAILED' "$tmp/build.log" | head -n 40
echo "FAIL - the release build"
echo "0 passed, 1 failed"
exit 1
