# pgkb — make targets. `make run` brings up a working knowledge base; `make test` is the test command.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PYTHON VENV

.PHONY: system setup setup-dev run stop test check lint typecheck pytest bench clean

## system: install python3 + python3-venv, PostgreSQL, plpython3u, pg_trgm, pgvector (scripts/setup.sh; as root
## or with sudo; quick when everything is there)
system:
	@bash scripts/setup.sh

## setup: system packages, then .venv with pgkb and what running it needs (scripts/venv.sh; a broken or
## half-made .venv is rebuilt)
setup: system
	@bash scripts/venv.sh run

## setup-dev: setup plus the test/dev extras (pytest, ruff, sqlfluff, mypy, sentence-transformers, torch CPU,
## dbt, selenium) and the headless browser the web page's test drives (chromium, chromium-driver)
setup-dev:
	@bash scripts/setup.sh --dev
	@bash scripts/venv.sh dev

## run: setup, then start the database, embed-server and MCP server, ingest examples/kb (or DOCS=...),
## run a sample search and print psql + IDE (MCP) configuration. `make stop` stops it all.
run: setup
	@$(BIN)/pgkb up $(if $(DOCS),--docs "$(DOCS)")

stop:
	@if [ -x $(BIN)/pgkb ]; then $(BIN)/pgkb down; else echo "stop: no $(BIN)/pgkb, so nothing was started by make run"; fi

## test: setup-dev, then ruff + sqlfluff + mypy + every test (CI's command; exit code 5 = no tests collected
## is a failure)
test: setup-dev lint typecheck pytest

## check: the fast tier while you work: the same minus the tests marked slow or reliability (docs/development.md, Tests)
check: PYTEST_ARGS = -m "not slow and not reliability"
check: setup-dev lint typecheck pytest

lint: setup-dev
	$(BIN)/ruff check python tests
	$(BIN)/sqlfluff lint db examples

typecheck: setup-dev
	$(BIN)/mypy

# PYTEST_ARGS: which tests (`make check` sets it for itself and its prerequisites)
pytest: setup-dev
	@set +e; $(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating as failure" >&2; exit 1; fi; \
	exit $$rc

## bench: search benchmark at CHUNKS synthetic chunks (default 100000): latency by mode, HNSW recall, index
## builds and sizes, concurrency sweep, MCP overhead; the report is appended to docs/benchmarks.md
CHUNKS ?= 100000
bench: setup
	$(BIN)/pgkb bench --chunks $(CHUNKS) --queries 200 --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache python/*.egg-info
