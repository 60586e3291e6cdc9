# The set-up commands: `make run` (a local cluster), `make test` (the suite) and
# `make bench` (benchmarks: JSON lines on stdout, see docs/benchmarks.md;
# BENCH_ARGS=--quick for a smoke run).
# Each creates .venv and installs the project into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench venv clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: venv
	$(BIN)/python scripts/run_local.py

test: venv
	$(BIN)/pytest $(PYTEST_ARGS)

bench: venv
	@$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache
