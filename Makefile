# idem - the commands of README.md.  The build itself is Meson + ninja;
# every target first installs any missing Debian package (scripts/deps.sh).
.PHONY: all build build-test build-asan run test test-quick bench soak fuzz lint chaos deb check-deb clean

MESON_OPTS ?=
FUZZ_SECONDS ?= 60
# make test builds every part, so that every part is tested.
TEST_FEATURES = -Dtests=enabled -Drocksdb=enabled -Dredis=enabled -Dpostgres=enabled -Dsqlite=enabled

# meson_tree DIR OPTIONS: set DIR up with OPTIONS, or apply them to the DIR
# that is there; meson's own messages are shown when it fails.
meson_tree = if [ -f $(1)/build.ninja ]; then meson configure $(1) $(2) >/dev/null; \
	else meson setup $(1) $(2) >$(1).setup.log 2>&1 || { cat $(1).setup.log; rm -f $(1).setup.log; exit 1; }; \
	rm -f $(1).setup.log; fi

all: build

# What running needs: no test tools, no test programs.
build:
	@scripts/deps.sh build
	@if [ ! -f build/build.ninja ]; then \
	  meson setup build --buildtype=debugoptimized -Dtests=disabled $(MESON_OPTS) >build.setup.log 2>&1 \
	    || { cat build.setup.log; rm -f build.setup.log; exit 1; }; rm -f build.setup.log; fi
	@ninja -C build
	@echo "built: build/idemd build/idemctl build/examples/demo-upstream"

# The optimised tree and the sanitizer tree, each with every part and test.
build-test:
	@scripts/deps.sh test
	@$(call meson_tree,build,--buildtype=debugoptimized $(TEST_FEATURES) $(MESON_OPTS))
	@ninja -C build

build-asan:
	@scripts/deps.sh test
	@$(call meson_tree,build-asan,-Db_sanitize=address,undefined -Db_lundef=false $(TEST_FEATURES) $(MESON_OPTS))
	@ninja -C build-asan

# The demo: an upstream on :9000 and idemd on :8080 with ./idem-data.
run: build
	@scripts/run.sh

# Every test suite (tests/meson.build) on the optimised and on the sanitizer
# tree, the fuzzers for FUZZ_SECONDS, the lint; ends "N passed, N failed".
test: build-test build-asan
	@IDEM_FUZZ_SECONDS=$(FUZZ_SECONDS) python3 scripts/run_tests.py

# The same on the optimised tree only, without the fuzzers.
test-quick: build-test
	@python3 scripts/run_tests.py --builds build --no-fuzz

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

# Exactly-once under faults: 2 idemd on LMDB, Redis, PostgreSQL and a Redis
# Cluster (when redis-server and redis-cli are installed), dropped answers,
# kill -9, store restarts (a cluster's master killed), in front of the
# recording upstream (90 s of faults per store, the cluster 25 s), then in
# front of idem-ledger (14 s per store, target 0 double effects); about 7
# minutes (tests/chaos/README.md).  CHAOS_ARGS goes
# to both runs; both run, and the target fails when either does.
CHAOS_ARGS ?=
chaos: build
	@scripts/deps.sh test
	@rc=0; \
	python3 tests/chaos/chaos.py --store all $(CHAOS_ARGS) || rc=1; \
	python3 tests/chaos/chaos.py --short --store all --upstream ledger $(CHAOS_ARGS) || rc=1; \
	exit $$rc

# The Debian packages idemd, idemctl, libidem0 and libidem-dev (debian/),
# built by dpkg-buildpackage from a copy of the tree, into build/deb/.
deb:
	@scripts/deps.sh deb
	@bash scripts/build_deb.sh

# make deb, then lintian, the unit file, the installed idemd proxying one
# request, the manual pages and libidem-dev, from the packages unpacked into
# a temporary root (scripts/check_deb.sh).
check-deb:
	@scripts/deps.sh deb
	@bash scripts/check_deb.sh

clean:
	rm -rf build build-asan build-fuzz fuzz/corpus-work
