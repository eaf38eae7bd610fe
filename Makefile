# `make test` and `make run` do all setup on a fresh clone: they create .venv and install the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-fast run notebook lint typecheck contracts bench clean prerequisites

# The install compiles privacy_wall/noise/_discrete_gaussian.pyx (setup.py; needs a C compiler, e.g. Debian's
# build-essential): editing either rebuilds it.
$(STAMP): pyproject.toml setup.py privacy_wall/noise/_discrete_gaussian.pyx
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# -qq: setuptools announces every editable install ("InformationOnly"); errors still show
	$(BIN)/pip install -qq -e ".[dev]"
	touch $(STAMP)

# What the tests need from the machine (PostgreSQL, Redis, chromium, a C compiler): started or installed
# where it can be, else named in one message before anything runs (tests/prerequisites.py).
prerequisites:
	@$(PYTHON) tests/prerequisites.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

# pytest exits 5 when it collected nothing: a suite that runs no test has failed. Two processes (pytest-xdist),
# a test file each at a time: its module fixtures (a running service) serve all its tests.
test: prerequisites lint typecheck contracts
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The tests that need no server (PostgreSQL, Redis, Chromium) and no more than a few seconds each: a quick
# check while working (pyproject.toml's markers; tests/servers.py fails a test that uses an unmarked server).
test-fast: $(STAMP)
	VIPS_TEST_NO_SERVERS=1 VIPS_TEST_REDIS=redis://127.0.0.1:1/0 $(BIN)/pytest -q -n 2 -p no:cacheprovider \
		-m "not slow and not postgres and not redis and not browser"

run: $(STAMP)
	$(BIN)/python -m vips.demo $(if $(KEEP),--keep)

# docs/notebook.ipynb against a running service: `make run KEEP=1` in one shell, its export lines (VIPS_URL,
# VIPS_API_KEY=$$ANALYST_KEY) in another, then `make notebook` opens it in JupyterLab, or `make notebook
# RUN=1` runs it top to bottom without a browser and writes the executed copy to var/notebook/.
NOTEBOOK_STAMP := $(VENV)/.notebook-installed
$(NOTEBOOK_STAMP): $(STAMP)
	$(BIN)/pip install -qq -e ".[notebook]"
	touch $(NOTEBOOK_STAMP)

notebook: $(NOTEBOOK_STAMP)
	@test -n "$$VIPS_API_KEY" || { echo "make notebook: export VIPS_URL and VIPS_API_KEY as \`make run KEEP=1\` prints them (the analyst's key)" >&2; exit 2; }
ifdef RUN
	$(BIN)/jupyter nbconvert --to notebook --execute docs/notebook.ipynb --output-dir var/notebook
else
	$(BIN)/jupyter lab docs/notebook.ipynb
endif

bench: $(STAMP)
	$(BIN)/python -m bench.adult_blr
	$(BIN)/python -m bench.blr_iteration
	$(BIN)/python -m bench.accounting
	$(BIN)/python -m bench.service_overhead
	$(BIN)/python -m bench.compare_algorithms
	$(BIN)/python -m bench.lda
	$(BIN)/python -m bench.sbn
	$(BIN)/python -m bench.dashboard

clean:
	rm -rf $(VENV) var .mypy_cache .pytest_cache .ruff_cache
