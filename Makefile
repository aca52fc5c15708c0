# Tenure — make demo (whole system on SQLite + filesystem broker), make test (the suite).
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/tenure
SQLITE_URL ?= sqlite:///var/tenure.sqlite3
PYTEST_ARGS ?=
## Each suite runs in two worker processes (most of its time is spent waiting on processes,
## leases and clusters, not on a core); a test file stays in one worker, in its own order, so
## its fixtures and seeded runs are as they are alone. PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
## The files that judge what VACUUM did (table compaction, index upkeep, database pressure)
## run after the others, alone: beside the other worker's load a compaction's second look once
## found nothing to do and an index upkeep rebuilt one index more, where alone they pass.
## PYTEST_ARGS narrows both runs.
ALONE := tests/db/test_table_compaction.py tests/db/test_index_upkeep.py \
	tests/db/test_database_pressure.py
NOT_ALONE = $(if $(XDIST),$(foreach f,$(ALONE),--ignore=$(f)),)

.PHONY: venv venv-dj6 test test-sqlite test-postgres test-dj6 lint typecheck demo clean docs

# Each install is tried up to three times, 10 s apart: pip retries a connection it could not
# open, not a download cut off midway ("Connection broken: IncompleteRead"), which once failed
# a CI run's install of the benchmark environment.
RETRY := @retry() { echo "$$*"; for i in 1 2 3; do "$$@" && return 0; echo "failed (try $$i of 3): $$*" >&2; [ $$i = 3 ] || sleep 10; done; return 1; }; retry

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(RETRY) $(BIN)/python -m pip install -q --upgrade pip
	$(RETRY) $(BIN)/python -m pip install -q -e ".[dev,tasks]"
	touch $@

venv: $(BIN)/.installed

## The second stack: Python 3.13 (pyenv's, else python3.13 on PATH) with Django 6.x, where
## django.tasks and template partials are Django's own (no backport, no django-template-partials).
PY_DJ6 ?= $(or $(wildcard $(shell pyenv prefix 3.13 2>/dev/null)/bin/python3.13),python3.13)
VENV_DJ6 := .venv-dj6
BIN_DJ6 := $(VENV_DJ6)/bin

$(BIN_DJ6)/.installed: pyproject.toml
	test -x $(BIN_DJ6)/python || $(PY_DJ6) -m venv $(VENV_DJ6)
	$(RETRY) $(BIN_DJ6)/python -m pip install -q --upgrade pip
	$(RETRY) $(BIN_DJ6)/python -m pip install -q -e ".[dev]" "django>=6,<7"
	touch $@

venv-dj6: $(BIN_DJ6)/.installed

## The whole suite: SQLite, then PostgreSQL (claim and fencing tests run there).
test: venv
	$(MAKE) test-sqlite
	$(MAKE) test-postgres

test-sqlite: venv
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python -m pytest -p no:randomly $(XDIST) $(PYTEST_ARGS)

test-postgres: venv
	DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest $(XDIST) $(NOT_ALONE) $(PYTEST_ARGS)
	$(if $(XDIST),DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest $(ALONE) $(PYTEST_ARGS))

## The suite on the second stack (Python 3.13, Django 6.x), on PostgreSQL. To keep CI within
## its time, DJ6_SKIP leaves out the files that spend the most time on what no Django version
## touches: the fault verifier's seeded runs (the first stack runs them),
## table compaction and index upkeep (their own SQL), and the process suites that kill, pause
## and race executors at the operating system's level (seeded kills, lease expiry, limits,
## liveness, a promoted standby: the same code on both stacks, run by `make test`). The executor's start, drain,
## signals, async handlers, cancel and schedules still run here as real processes.
## `make test-dj6 DJ6_SKIP=` runs all.
DJ6_SKIP ?= --ignore=tests/process/test_chaos.py --ignore=tests/db/test_table_compaction.py \
	--ignore=tests/db/test_index_upkeep.py --ignore=tests/process/test_effects.py \
	--ignore=tests/process/test_executors.py --ignore=tests/process/test_scheduler_liveness.py \
	--ignore=tests/process/test_queue_limits.py --ignore=tests/process/test_poison.py \
	--ignore=tests/process/test_health.py --ignore=tests/process/test_failover.py
# The ALONE files DJ6_SKIP does not leave out (a path named on the command line is collected
# whatever --ignore says).
DJ6_ALONE = $(filter-out $(patsubst --ignore=%,%,$(DJ6_SKIP)),$(ALONE))
test-dj6: venv-dj6
	DATABASE_URL=$(PG_URL) $(BIN_DJ6)/python -m pytest $(DJ6_SKIP) $(XDIST) $(NOT_ALONE) $(PYTEST_ARGS)
	$(if $(and $(XDIST),$(DJ6_ALONE)),DATABASE_URL=$(PG_URL) $(BIN_DJ6)/python -m pytest $(DJ6_ALONE) $(PYTEST_ARGS))

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy scheduler_core admin_ui config demo verifier

demo: venv
	$(BIN)/python -m demo.run

## The docs site (mkdocs.yml) into var/site/, strict: a warning, a page, link or anchor that is
## missing fails it. Open var/site/index.html, or `$(BIN)/mkdocs serve` while writing. Not
## --quiet: it drops the warnings before strict mode counts them, and the build passes.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf var/*.sqlite3* var/broker

## The fault verifier (docs/reliability.md): seeded faults on a PostgreSQL cluster of its own,
## then every invariant checked; exits non-zero when one fails. CHAOS_SECONDS of faults.
CHAOS_SECONDS ?= 1800
CHAOS_SEED ?= 1
.PHONY: chaos chaos-smoke chaos-deps

chaos: venv chaos-deps
	$(BIN)/python manage.py chaos --seconds $(CHAOS_SECONDS) --seed $(CHAOS_SEED) --report var/chaos-report.json

## About two minutes of the same, for CI.
chaos-smoke: venv chaos-deps
	$(BIN)/python manage.py chaos --seconds 75 --seed $(CHAOS_SEED) --report var/chaos-smoke-report.json

## The failover nemesis (docs/reliability.md, "Failover"): a primary and its streaming standby
## of its own, the primary crashed mid-run and the standby promoted, in synchronous then
## asynchronous replication; both drains after the promotion in one report. FAILOVER_JOBS per mode.
FAILOVER_JOBS ?= 1200
.PHONY: chaos-failover chaos-failover-short
chaos-failover: venv
	$(BIN)/python manage.py chaos_failover --jobs $(FAILOVER_JOBS) --report var/chaos-failover-report.json

## The same with 300 jobs per mode (about 70 s); CI runs tests/process/test_failover.py instead.
chaos-failover-short: venv
	$(BIN)/python manage.py chaos_failover --jobs 300 --gap 1 --report var/chaos-failover-short-report.json

chaos-deps:
	@command -v faketime >/dev/null || apt-get install -y faketime

## Benchmarks against peers (bench/README.md), in an environment of their own under var/:
## `make bench` is the quick profile (about 10 minutes on 2 cores), `make bench-full` the full one.
## Both drain every system at its best (2 processes x 8 concurrent jobs, the headline) and in the
## same shape (N processes of one job at a time), on a PostgreSQL cluster the run initdb's for
## itself (production defaults, autovacuum on; removed afterwards), and need Redis
## (127.0.0.1:6379); reports go to bench/results/. BENCH_ARGS passes more options, e.g.
## BENCH_ARGS="--server shared" (the server at 127.0.0.1:5432) or BENCH_ARGS="--shapes best".
BENCH_VENV := var/bench-venv
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_ARGS ?=
.PHONY: bench bench-full bench-venv

$(BENCH_VENV)/.installed: pyproject.toml bench/requirements.txt
	test -x $(BENCH_PY) || $(PY) -m venv $(BENCH_VENV) || python3 -m venv $(BENCH_VENV)
	$(RETRY) $(BENCH_PY) -m pip install -q --upgrade pip
	$(RETRY) $(BENCH_PY) -m pip install -q -e ".[demo,rq,otel]" -r bench/requirements.txt
	touch $@

bench-venv: $(BENCH_VENV)/.installed

bench: bench-venv
	PYTHONPATH=. $(BENCH_PY) -m bench.run --profile quick $(BENCH_ARGS)

bench-full: bench-venv
	PYTHONPATH=. $(BENCH_PY) -m bench.run --profile full $(BENCH_ARGS)

## The soak (bench/README.md, "Soak"): Tenure, pgqueuer and procrastinate one after another on a
## PostgreSQL cluster of its own (production defaults, autovacuum on), each SOAK_MINUTES under
## steady arrivals with a snapshot held through the middle third. Needs no shared server.
## `make soak` writes bench/results/<date>-soak.md (a little over 3 hours; SOAK_ARGS passes more
## options, e.g. SOAK_ARGS="--rate 150"); `make soak-short` is the CI check (about 4 minutes,
## report in var/soak/), failing only when the harness breaks.
SOAK_MINUTES ?= 60
SOAK_ARGS ?=
.PHONY: soak soak-short

soak: bench-venv
	PYTHONPATH=. $(BENCH_PY) -m bench.soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

soak-short: bench-venv
	PYTHONPATH=. $(BENCH_PY) -m bench.soak --short
