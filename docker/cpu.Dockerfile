# The DSpark serving image for CPU-only nodes and laptops.
#   docker build -f docker/cpu.Dockerfile -t dspark-serve:0.1.0-cpu .                                (make image)
#   ... --build-arg DEMO_MODELS=true -t dspark-serve:0.1.0-cpu-demo .   (bakes in the demo models, ~15 min)
#   docker run -p 8000:8000 -p 9000:9000 dspark-serve:0.1.0-cpu-demo   (make serve, in a container)
# The install step is scripts/install.sh, the very script `make install` and CI run.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/dspark
COPY . .
# Point this at an index with CPU-only torch wheels to keep the image small.
ARG PIP_EXTRA_INDEX_URL=""
RUN PYTHON=python3 scripts/install.sh /opt/venv ""
# The demo stack of `make models`, built from the standard library's text (no download).
ARG DEMO_MODELS=false
RUN if [ "${DEMO_MODELS}" = "true" ]; then \
        OMP_NUM_THREADS=2 /opt/venv/bin/python -m drafter_service.demo.build --out /opt/dspark/models; \
    fi

FROM ${BASE} AS runtime
# wget: KubeRay's exec probes call it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /bin/bash ray \
    && mkdir -p /var/cache/dspark \
    && chown 1000:1000 /var/cache/dspark
COPY --from=build --chown=1000:1000 /opt/venv /opt/venv
COPY --from=build --chown=1000:1000 /opt/dspark /opt/dspark
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 DSPARK_CACHE_DIR=/var/cache/dspark
WORKDIR /opt/dspark
USER 1000
EXPOSE 8000 9000
CMD ["python", "-m", "deployments.serve", "--config", "configs/local.yaml"]
