# The two commands a newcomer types: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench bench-quick clean

$(STAMP): requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmpack demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(PY) -m benchmarks

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
