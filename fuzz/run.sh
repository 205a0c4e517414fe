#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] - build the libFuzzer targets and run each of them.
#
# Builds in build-fuzz with clang, AddressSanitizer and UBSan (configured only
# the first time), then runs every target fuzz/fuzz_<name>.c for SECONDS
# divided by the number of targets (default 60 s in all), on a working copy of
# its seed corpus in fuzz/corpus-work/<name>/ (gitignored; new inputs land
# there) plus the seed corpus fuzz/corpus/<name>/ itself.  A crash leaves its
# input as fuzz/corpus-work/<name>-crash-* and makes the script exit 1.
#
# Every library is compiled with -fsanitize=fuzzer-no-link so coverage
# guides the fuzzers through it; only the fuzz executables link libFuzzer.
set -euo pipefail

total=${1:-60}
case $total in
  ''|*[!0-9]*) echo "usage: fuzz/run.sh [SECONDS]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=build-fuzz

if [ ! -f "$build/build.ninja" ]; then
  CC=clang meson setup "$build" \
    -Db_sanitize=address,undefined -Dfuzz=true -Dtests=false \
    -Dc_args='-fsanitize=fuzzer-no-link -fno-sanitize-recover=undefined'
fi

names=()
for src in fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  name=${src#fuzz/fuzz_}
  names+=("${name%.c}")
done
if [ ${#names[@]} -eq 0 ]; then
  echo "fuzz/run.sh: no fuzz targets" >&2
  exit 1
fi

targets=()
for name in "${names[@]}"; do
  targets+=("fuzz/fuzz_$name")
done
ninja -C "$build" "${targets[@]}"

per=$(( total / ${#names[@]} ))
[ "$per" -ge 1 ] || per=1

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

failed=()
for name in "${names[@]}"; do
  seeds=fuzz/corpus/$name
  work=fuzz/corpus-work/$name
  mkdir -p "$work" "$seeds"
  cp -R "$seeds/." "$work/"
  echo "== fuzz_$name for ${per}s"
  if ! "$build/fuzz/fuzz_$name" -max_total_time="$per" -print_final_stats=1 \
      -artifact_prefix="fuzz/corpus-work/$name-" "$work" "$seeds"; then
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz/run.sh: crashes in: ${failed[*]} (inputs in fuzz/corpus-work/)" >&2
  exit 1
fi
echo "fuzz/run.sh: no crashes in ${#names[@]} targets"
