# One entry point for every job; each target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODELS ?= models

.PHONY: install test lint bench serve demo models chart image clean sim

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
	OMP_NUM_THREADS=1 $(PY) bench/demo_quality.py --models $(MODELS)
	$(PY) bench/load.py --models $(MODELS) --reprofile
	$(PY) bench/serve.py --model $(MODELS)/target --drafter dspark --num-speculative-tokens 7 --prompts 16 \
		--max-tokens 64 --repeats 2 --direct-ingress
	$(PY) bench/serve.py --model $(MODELS)/target --drafter dspark --num-speculative-tokens 7 --prompts 16 \
		--max-tokens 64 --repeats 2 --out bench/results/serve_proxy.json
	$(PY) bench/prefix.py --model $(MODELS)/target
	$(PY) bench/route_decision.py
	$(PY) bench/route_stats_cost.py --model $(MODELS)/target
	$(PY) bench/route.py --models $(MODELS)
	$(PY) bench/control.py --model $(MODELS)/target --drafter dspark
	$(PY) bench/telemetry.py --model $(MODELS)/target

# The cluster simulator's benchmark (bench/sim.py): routing x budget arms at 100 and 1,000 simulated GPU
# replicas, the router's decision time at 1,000, and validation against real Ray Serve (needs the models).
# About 56 min on an idle 2-core machine: the simulation ~50 (36 runs at 100 replicas, 60 s traces: 3,505
# CPU-s; 3 runs at 1,000, 60 s traces since session 22: 1,821 CPU-s; ~45 min on 2 workers; then the scale
# section alone ~6: its trace is 30 s since session 10: ~340 CPU-s, estimated from a 16 s trace's CPU per
# simulated second), the validation ~6 (two real runs on the committed profile, the simulator under six
# seeds; `$(PY) bench/sim_validate.py --models $(MODELS) --measure-profile` after `bench/sim.py
# --skip-validation` measures the profile between them instead, ~7.5 min: two real runs of ~2.5 and the
# measurement ~2). `$(PY) bench/sim.py --quick` is a smoke run.
sim: install
	$(PY) bench/sim.py --models $(MODELS)
	$(PY) bench/sim_seeds.py  # the summary's arms at 80% under seeds 1 and 2 (its noise band): ~2.5 min
	$(PY) bench/route_sim.py  # bench/route.py's two settings simulated, 12 seeds: ~1 min
	$(PY) bench/route_sim.py --tau-spread 0.45 --out bench/results/route_sim_tau_spread.json

# The main job: an embedded local Ray serving the demo stack (OpenAI HTTP :8000, gRPC :9000);
# builds the models first if they are absent. Ctrl-C shuts it down.
serve: install
	$(PY) -m deployments.serve --config configs/local.yaml

# The same, plus a short client session that streams a completion and prints speculation stats.
demo: install
	$(PY) -m deployments.serve --config configs/local.yaml --demo

# The Helm chart: lint it and render it for every values profile (charts/dspark/ci/*.yaml) into build/chart/;
# fails on any lint finding above INFO. Real Helm through its Go SDK: no helm binary, no cluster.
chart: install
	$(PY) scripts/chart.py --out build/chart

# Container images (docker/*.Dockerfile) with docker or podman, where one can build; elsewhere it says so
# and stops without failing. Tags match the chart: $(IMAGE):$(VERSION)-cuda and -cpu-demo (demo models inside).
IMAGE ?= dspark-serve
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then builder=docker; \
	elif command -v podman >/dev/null 2>&1 && podman info >/dev/null 2>&1; then builder=podman; \
	else echo "[image] no container builder here (docker or podman with a working daemon): nothing built."; \
		echo "[image] elsewhere: docker build -f docker/cuda.Dockerfile -t $(IMAGE):$(VERSION)-cuda ."; \
		exit 0; fi; \
	set -e; \
	$$builder build -f docker/cuda.Dockerfile -t $(IMAGE):$(VERSION)-cuda .; \
	$$builder build -f docker/cpu.Dockerfile --build-arg DEMO_MODELS=true -t $(IMAGE):$(VERSION)-cpu-demo .

clean:
	rm -rf $(VENV) .pytest_cache build/chart
