# One entry point for every job; each target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODELS ?= models

.PHONY: install test lint bench demo models clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

models: install
	$(PY) -m drafter_service.build_models --out $(MODELS)

bench: models
	$(PY) bench/speed.py --model $(MODELS)/target

demo: models
	$(VENV)/bin/dspark generate --model $(MODELS)/target --drafter ngram --max-tokens 64 \
		--prompt "def parse_args(argv):"

clean:
	rm -rf $(VENV) .pytest_cache
