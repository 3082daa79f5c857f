# The two commands a newcomer types: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench bench-quick clean

$(STAMP): requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmpack demo

# Kernel test modules again, with numba's bounds checking on (its own compile cache), so any
# out-of-bounds read on the random inputs of the property tests raises instead of passing; then
# the table of every kernel against its twin (tests/test_reference.py, which fails when a kernel
# is missing from it) with the JIT off, so every kernel runs as the plain Python its source reads
# as.
KERNEL_TESTS := tests/core/test_permutation_keys.py tests/formats/test_eos_separated.py \
	tests/formats/test_foreign.py tests/formats/test_sidecar.py tests/formats/test_token_ids.py \
	tests/kernels/test_eos.py tests/kernels/test_masking.py \
	tests/kernels/test_packed_rows.py tests/kernels/test_pagestate.py \
	tests/kernels/test_permutation.py tests/kernels/test_plan_bestfit.py \
	tests/kernels/test_store.py tests/kernels/test_streaming_batch.py tests/kernels/test_window.py \
	tests/packing/test_masking.py tests/packing/test_plan.py \
	tests/sampling/test_mixture.py tests/sampling/test_mixture_batches.py \
	tests/sampling/test_mixture_stats.py tests/sampling/test_permutation.py \
	tests/sampling/test_weights.py tests/streaming/test_admission.py \
	tests/streaming/test_checkpoint.py tests/streaming/test_config.py \
	tests/streaming/test_incoming.py tests/streaming/test_packer.py \
	tests/streaming/test_pieces.py tests/streaming/test_sources.py tests/streaming/test_stats.py \
	tests/test_getitem_fast.py tests/views/test_batch.py tests/views/test_packed.py \
	tests/views/test_packed_gather.py tests/views/test_window.py tests/views/test_window_stats.py \
	tests/test_reference.py

test: $(STAMP)
	$(PY) -m pytest -n 2 -q
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(VENV)/numba-boundscheck $(PY) -m pytest -n 2 -q $(KERNEL_TESTS)
	NUMBA_DISABLE_JIT=1 HYPOTHESIS_PROFILE=nojit $(PY) -m pytest -n 2 -q tests/test_reference.py

# Lint, formatting and types (CI runs this before the tests).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site (docs/ and the API reference from the docstrings) into site/; warnings
# are errors.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) -m benchmarks

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
