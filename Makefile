# pg_ticket: `make run` (demo), `make test` (every tier), `make bench`.
# Every target installs what it is missing first (scripts/setup.sh).

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo --sudo)
# Debug builds for the demo and the tests (quicker to build); the benchmark
# installs a release build.
PROFILE ?= debug
PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

.PHONY: setup install run stop test test-unit test-pgrx test-regress test-integration bench

setup:
	@scripts/setup.sh

install: setup
	cargo pgrx install --pg-config $(PG_CONFIG) $(PROFILE_FLAG) $(SUDO)

run: install
	scripts/demo.sh

stop:
	scripts/cluster.sh stop /tmp/pgt-demo

test: setup
	$(MAKE) test-unit
	$(MAKE) test-pgrx
	$(MAKE) install
	$(MAKE) test-regress
	$(MAKE) test-integration
	@echo "make test: every tier passed"

test-unit:
	cargo test -p ticket-core

# cargo pgrx test installs its own test build and runs a cluster as `postgres`.
test-pgrx: setup
	scripts/pgrx-test.sh

test-regress:
	scripts/regress.sh

test-integration:
	cargo test -p pg_ticket_integration -- --test-threads=4

bench:
	$(MAKE) install PROFILE=release
	scripts/bench.sh
