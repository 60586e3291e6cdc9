# The two set-up commands: `make run` (a local cluster) and `make test` (the suite).
# Both create .venv and install the project into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv clean

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

clean:
	rm -rf $(VENV) var .pytest_cache
