# The set-up commands: `make run` (a local cluster), `make test` (the suite),
# `make check` (under a minute: lint, types, the unit and API tests) and
# `make bench` (benchmarks: JSON lines on stdout, see docs/benchmarks.md;
# BENCH_ARGS=--quick for a smoke run).
# Each creates .venv and installs the project into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check bench venv clean settings-doc

# Bytecode is written, whatever the environment says: pytest keeps its assertion-
# rewritten test modules in __pycache__, and a run that finds them collects the suite
# in a third of the time (15 s to 5 s per test process on two cores).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: venv
	$(BIN)/python scripts/run_local.py

# Two test processes, a file each at a time (a file's tests share its fixtures, and the
# network-namespace tests of one file must not overlap): most end-to-end tests wait on
# real processes, so two at once nearly halve the run on two cores.
test: venv
	$(BIN)/pytest -n 2 --dist loadfile $(PYTEST_ARGS)

# mypy reads the packages from a tree of links named as they are imported
# (control-plane/ is no package). The tree is kept (its links only set again): mypy
# drops its cache when the tree is made anew, and with the cache a check reads only
# what changed. The tests that start no server processes and are not marked slow run
# on 2 cores, an idle core taking tests still queued for the other.
TYPECHECK := $(VENV)/typecheck
check: venv
	$(BIN)/ruff check shared control-plane agent cli scripts tests
	@mkdir -p $(TYPECHECK)/corral
	@for p in shared agent cli; do ln -sfn $(CURDIR)/$$p $(TYPECHECK)/corral/$$p; done
	@for p in registry scheduler server; do ln -sfn $(CURDIR)/control-plane/$$p $(TYPECHECK)/corral/$$p; done
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/setup.cfg
	$(BIN)/pytest -q -n 2 --dist worksteal -p no:cacheprovider -m "not e2e and not root and not slow"

bench: venv
	@$(BIN)/python scripts/bench.py $(BENCH_ARGS)

# docs/settings.md from the settings' definitions (tests/scripts/test_settings_doc.py checks it).
settings-doc: venv
	$(BIN)/python scripts/settings_doc.py docs/settings.md

clean:
	rm -rf $(VENV) var .pytest_cache
