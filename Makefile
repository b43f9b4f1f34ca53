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

# The demo stack from the standard library's own text: tokenizer, target, then every drafter
# (about 15 minutes on an idle 2-core machine; steps already built are skipped).
models: install
	$(PY) -m drafter_service.build_models --out $(MODELS)

bench: models
	$(PY) bench/speed.py --model $(MODELS)/target
	$(PY) bench/accept.py --models $(MODELS)

demo: models
	$(VENV)/bin/dspark generate --model $(MODELS)/target --drafter dspark --max-tokens 96 \
		--temperature 0.8 --seed 1 --prompt "def parse_args(argv):" --json

clean:
	rm -rf $(VENV) .pytest_cache
