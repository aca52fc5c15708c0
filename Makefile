# Tenure — make demo (whole system on SQLite + filesystem broker), make test (the suite).
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/tenure
SQLITE_URL ?= sqlite:///var/tenure.sqlite3
PYTEST_ARGS ?=

.PHONY: venv test test-sqlite test-postgres lint typecheck demo clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

## The whole suite: SQLite, then PostgreSQL (claim and fencing tests run there).
test: venv
	$(MAKE) test-sqlite
	$(MAKE) test-postgres

test-sqlite: venv
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python -m pytest -p no:randomly $(PYTEST_ARGS)

test-postgres: venv
	DATABASE_URL=$(PG_URL) $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy scheduler_core admin_ui config demo

demo: venv
	$(BIN)/python -m demo.run

clean:
	rm -rf var/*.sqlite3* var/broker
