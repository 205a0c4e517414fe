# idem - the commands of README.md.  The build itself is Meson + ninja;
# every target first installs any missing Debian package (scripts/deps.sh).
.PHONY: all build build-asan run test test-quick bench soak fuzz lint chaos clean

MESON_OPTS ?=
FUZZ_SECONDS ?= 60

all: build

build:
	@scripts/deps.sh build
	@test -f build/build.ninja || meson setup build --buildtype=debugoptimized $(MESON_OPTS) >/dev/null
	@ninja -C build
	@echo "built: build/idemd build/idemctl build/examples/demo-upstream"

build-asan:
	@scripts/deps.sh test
	@test -f build-asan/build.ninja || meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false $(MESON_OPTS) >/dev/null
	@ninja -C build-asan

# The demo: an upstream on :9000 and idemd on :8080 with ./idem-data.
run: build
	@scripts/run.sh

# Every test: unit, store conformance and black-box, on the optimised and on
# the sanitizer build, then the HTTP fuzzers for FUZZ_SECONDS, then lint.
test: build build-asan
	@python3 scripts/run_tests.py --fuzz-seconds $(FUZZ_SECONDS)

# The same without the sanitizer build and the fuzzers.
test-quick: build
	@python3 scripts/run_tests.py --builds build --fuzz-seconds 0

bench: build
	@scripts/deps.sh bench
	@bash bench/run.sh

# idemd under mixed load for SOAK_SECONDS (300): fails when its RSS or open
# fds grow once the working set is reached (tests/soak/soak.py).
soak: build
	@python3 tests/soak/soak.py

fuzz:
	@scripts/deps.sh test
	@bash fuzz/run.sh $(FUZZ_SECONDS)

lint:
	@sh scripts/lint.sh

# Exactly-once under faults: 2 idemd on LMDB, Redis and PostgreSQL, dropped
# answers, kill -9, store restarts, in front of the recording upstream (90 s
# of faults per store), then in front of idem-ledger (14 s per store, target
# 0 double effects); about 6 minutes (tests/chaos/README.md).  CHAOS_ARGS goes
# to both runs; both run, and the target fails when either does.
CHAOS_ARGS ?=
chaos: build
	@scripts/deps.sh test
	@rc=0; \
	python3 tests/chaos/chaos.py --store all $(CHAOS_ARGS) || rc=1; \
	python3 tests/chaos/chaos.py --short --store all --upstream ledger $(CHAOS_ARGS) || rc=1; \
	exit $$rc

clean:
	rm -rf build build-asan build-fuzz fuzz/corpus-work
