# The two commands of the README. Both set up ./.venv first (scripts/setup_env.sh; a no-op once done).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint format demo

setup:
	@scripts/setup_env.sh

# the full test suite: formatter, linter, pytest (what .ci/run runs)
test: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q tests

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# the main job on the embedded corpus: sentencepiece, preprocess, train, generate + BLEU, interactive, attention plot
demo: setup
	$(PY) examples/quickstart/run.py
