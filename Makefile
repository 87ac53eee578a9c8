# pgkb — make targets. `make run` brings up a working knowledge base; `make test` is the test command.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup venv run stop test lint pytest bench clean

## setup: install PostgreSQL, plpython3u, pg_trgm, pgvector (scripts/setup.sh) and the Python venv
setup: venv
	@bash scripts/setup.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing Python packages into $(VENV)"
	@$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	@$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

## run: setup, then start the database, embed-server and MCP server, ingest examples/kb (or DOCS=...),
## run a sample search and print psql + IDE (MCP) configuration. `make stop` stops it all.
run: setup
	@$(BIN)/pgkb up $(if $(DOCS),--docs "$(DOCS)")

stop: venv
	@$(BIN)/pgkb down

## test: setup, then ruff + sqlfluff + pytest (exit code 5 = no tests collected is a failure)
test: setup lint pytest

lint: venv
	$(BIN)/ruff check python tests
	$(BIN)/sqlfluff lint db examples

pytest: venv
	@set +e; $(BIN)/pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: treating as failure" >&2; exit 1; fi; \
	exit $$rc

## bench: search benchmark at CHUNKS synthetic chunks (default 100000): latency by mode, HNSW recall, index
## builds and sizes, concurrency sweep, MCP overhead; the report is appended to docs/benchmarks.md
CHUNKS ?= 100000
bench: setup
	$(BIN)/pgkb bench --chunks $(CHUNKS) --queries 200 --out docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache python/*.egg-info
