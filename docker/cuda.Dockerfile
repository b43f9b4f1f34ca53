# The DSpark serving image for GPU nodes (what charts/dspark runs by default: dspark-serve:<version>-cuda).
#   docker build -f docker/cuda.Dockerfile -t dspark-serve:0.1.0-cuda .          (make image)
#   ... --build-arg EXTRAS=sglang -t dspark-serve:0.1.0-cuda-sglang .            (the SGLang backend)
# The install step is scripts/install.sh, the very script `make install` and CI run.
ARG BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/dspark
COPY . .
# Extras of dspark-serve to add (e.g. sglang); PyPI's torch wheel for Linux is the CUDA build.
ARG EXTRAS=""
ARG PIP_EXTRA_INDEX_URL=""
RUN PYTHON=python3 scripts/install.sh /opt/venv "${EXTRAS}"

FROM ${BASE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# wget: KubeRay's exec probes call it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 wget \
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
