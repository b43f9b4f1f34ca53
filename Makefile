# One entry point for every job; each target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODELS ?= models

.PHONY: install test lint bench serve demo models clean

install: $(VENV)/.installed

# The same script installs the container images (docker/), so every test run exercises it.
$(VENV)/.installed: pyproject.toml sdk/pyproject.toml proto/dspark/v1/generation.proto scripts/install.sh
	PYTHON=$(PYTHON) scripts/install.sh $(VENV) dev
	touch $@

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The demo stack from the standard library's own text: tokenizer, target, then every drafter
# (about 15 minutes on an idle 2-core machine; steps already built are skipped).
models: install
	$(PY) -m drafter_service.demo.build --out $(MODELS)

# Speed benchmarks compare methods side by side in one run; run them on an otherwise idle machine.
bench: models
	$(PY) bench/speed.py --model $(MODELS)/target
	OMP_NUM_THREADS=1 $(PY) bench/accept.py --models $(MODELS)
	$(PY) bench/load.py --models $(MODELS) --reprofile
	$(PY) bench/serve.py --model $(MODELS)/target --drafter dspark --num-speculative-tokens 7 --prompts 16 \
		--max-tokens 64 --repeats 2

# The main job: an embedded local Ray serving the demo stack (OpenAI HTTP :8000, gRPC :9000);
# builds the models first if they are absent. Ctrl-C shuts it down.
serve: install
	$(PY) -m deployments.serve --config configs/local.yaml

# The same, plus a short client session that streams a completion and prints speculation stats.
demo: install
	$(PY) -m deployments.serve --config configs/local.yaml --demo

clean:
	rm -rf $(VENV) .pytest_cache
