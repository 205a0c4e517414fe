#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] - build the libFuzzer targets and run each of them.
#
# SECONDS is the budget for the whole run (default $IDEM_FUZZ_SECONDS, else
# 60), split evenly between the targets (at least 1 s each): `fuzz/run.sh 60`
# with eight targets gives each 7 s, which is what `make test` runs (the
# meson test `fuzz`); `make fuzz FUZZ_SECONDS=N` passes N the same way.  To fuzz one target for longer, run
# its binary by hand (fuzz/README.md).
#
# Builds in build-fuzz with clang, AddressSanitizer and UBSan (configured the
# first time, and again when a target is missing from it), then runs every
# target fuzz/fuzz_<name>.c on a working copy of its seed corpus in
# fuzz/corpus-work/<name>/ (gitignored; new inputs land there) plus the seed
# corpus fuzz/corpus/<name>/ itself, with the dictionary fuzz/<name>.dict
# when there is one.  Each target's output goes to
# fuzz/corpus-work/<name>.log; a summary line per target is printed (execs,
# coverage, corpus size, result), and the log's end for a target that
# failed.  A crash, a violated property (abort), a leak or an input slower
# than 10 s leaves its input as fuzz/corpus-work/<name>-{crash,leak,timeout}-*
# and makes the script exit 1.
#
# Every library is compiled with -fsanitize=fuzzer-no-link so coverage
# guides the fuzzers through it; only the fuzz executables link libFuzzer.
set -euo pipefail

total=${1:-${IDEM_FUZZ_SECONDS:-60}}
case $total in
  ''|*[!0-9]*) echo "usage: fuzz/run.sh [SECONDS]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=build-fuzz

if [ ! -f "$build/build.ninja" ]; then
  CC=clang meson setup "$build" \
    -Db_sanitize=address,undefined -Dfuzz=true -Dtests=disabled \
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
# meson.build skips a target whose source did not exist at configure time.
known=$(ninja -C "$build" -t targets all)
for t in "${targets[@]}"; do
  if ! grep -q "^$t:" <<<"$known"; then
    meson setup --reconfigure "$build" >/dev/null
    break
  fi
done
ninja -C "$build" "${targets[@]}"

per=$(( total / ${#names[@]} ))
[ "$per" -ge 1 ] || per=1

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

failed=()
summary=()
for name in "${names[@]}"; do
  seeds=fuzz/corpus/$name
  work=fuzz/corpus-work/$name
  log=fuzz/corpus-work/$name.log
  mkdir -p "$work" "$seeds"
  cp -R "$seeds/." "$work/"
  dict=()
  [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
  echo "== fuzz_$name for ${per}s (log: $log)"
  result=ok
  if ! "$build/fuzz/fuzz_$name" -max_total_time="$per" -timeout=10 -print_final_stats=1 \
      "${dict[@]}" -artifact_prefix="fuzz/corpus-work/$name-" "$work" "$seeds" >"$log" 2>&1; then
    result=FOUND
    failed+=("$name")
    tail -n 60 "$log"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 || true)
  files=$(find "$work" -type f | wc -l)
  line=$(printf '%-14s %8s execs  %-18s corpus %5s  %s' "$name" "${execs:-?}" \
    "${cov:-cov: ?}" "$files" "$result")
  echo "$line"
  summary+=("$line")
done

echo "== fuzz summary (${per}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz/run.sh: findings in: ${failed[*]} (inputs in fuzz/corpus-work/)" >&2
  exit 1
fi
echo "fuzz/run.sh: nothing found in ${#names[@]} targets"
