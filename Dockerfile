# syntax=docker/dockerfile:1
#
# One image, two services:
#   docker build -t codemode:dev .
#   docker run codemode:dev registry_service          (the default command)
#   docker run codemode:dev runtime_service           (needs the securityContext in deploy/README.md)
# The entrypoint is `tini -- python -m`, so the command names the module to run; extra
# arguments follow it (`registry_service --config /etc/codemode/registry.yaml`).
#
# The image runs as the unprivileged user 10001. The runtime is the one exception, chosen by its
# deployment (compose / kustomize), not by the image: its worker sandbox creates mount and network
# namespaces, a cgroup per run below the container's own (remounting the container's read-only
# cgroup2 mount read-write: CODEMODE_RUNTIME_CGROUP_REMOUNT) and drops each worker to a uid of its
# own, which only a root process holding CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID can do
# (deploy/README.md, "Runtime pod security").
#
# TypeScript programs run on Node 20: the runtime's image carries the node binary of the official
# image and the TypeScript worker (runtime_service/worker_ts) with its locked node_modules
# (amaro, the type stripper), installed by `npm ci` from the worker's package-lock.json.
#
# Pin the bases by digest in CI (--build-arg PYTHON_IMAGE=python:3.11-slim@sha256:...,
# --build-arg NODE_IMAGE=node:20.20.2-bookworm-slim@sha256:...).
ARG PYTHON_IMAGE=python:3.11-slim
ARG NODE_IMAGE=node:20.20.2-bookworm-slim

# The TypeScript worker's dependencies, exactly as locked (no install scripts run).
FROM ${NODE_IMAGE} AS worker-ts
WORKDIR /worker_ts
COPY runtime_service/worker_ts/package.json runtime_service/worker_ts/package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/codemode
# Dependencies first, exactly as locked, so that source edits reuse this layer.
COPY requirements/main.lock /tmp/main.lock
RUN /opt/codemode/bin/pip install --requirement /tmp/main.lock
# Then the project itself (not editable; .dockerignore keeps the context to the packages).
COPY . /src
RUN /opt/codemode/bin/pip install --no-deps /src \
    && /opt/codemode/bin/pip check \
    && /opt/codemode/bin/python -c "import registry_service.server, runtime_service.server"
# Beside the installed worker.js (package data), where the runtime looks for them.
COPY --from=worker-ts /worker_ts/node_modules /tmp/worker_ts_modules
RUN cp -r /tmp/worker_ts_modules "$(/opt/codemode/bin/python -c \
        'from runtime_service.worker_process import _TS_WORKER_DIR; print(_TS_WORKER_DIR)')/node_modules" \
    && rm -rf /tmp/worker_ts_modules

FROM ${PYTHON_IMAGE}
# tini is PID 1: it forwards SIGTERM to the service (both shut down gracefully on it) and reaps
# orphans. The runtime kills each worker with its process group; anything a program left behind
# is re-parented to PID 1, and a Python PID 1 would never reap it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends tini libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 codemode \
    && useradd --system --uid 10001 --gid codemode --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin codemode \
    && install --directory --owner 10001 --group 10001 --mode 0750 /var/lib/codemode
COPY --from=build /opt/codemode /opt/codemode
# Node for TypeScript workers (a single binary; it needs only libc and libstdc++). The runtime
# serves TypeScript only where node and the worker's node_modules are both present, and the
# opt-in `monty` language only where pydantic_monty and its `monty` binary (main.lock, in
# /opt/codemode) are: both checked here.
COPY --from=worker-ts /usr/local/bin/node /usr/local/bin/node
RUN node --version \
    && /opt/codemode/bin/python -c "import sys; from runtime_service.languages import typescript; \
from runtime_service.worker_process import WorkerSpec; \
sys.exit(typescript.BACKEND.unavailable(WorkerSpec()))" \
    && /opt/codemode/bin/python -c "import sys; from runtime_service.languages import monty; \
from runtime_service.worker_process import WorkerSpec; \
sys.exit(monty.BACKEND.unavailable(WorkerSpec()))"
# The root filesystem is read-only in every deployment: bytecode was compiled at install time,
# /tmp and /var/lib/codemode are volumes. Containers must listen beyond loopback.
ENV PATH=/opt/codemode/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CODEMODE_REGISTRY_LISTEN=0.0.0.0:50051 \
    CODEMODE_REGISTRY_HISTORY_PATH=/var/lib/codemode/history.sqlite3 \
    CODEMODE_RUNTIME_LISTEN=0.0.0.0:50052
WORKDIR /var/lib/codemode
USER 10001:10001
EXPOSE 50051 50052
ENTRYPOINT ["/usr/bin/tini", "--", "python", "-m"]
CMD ["registry_service"]
