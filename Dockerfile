# syntax=docker/dockerfile:1
# One image for every devheal entry point; the manifests in deploy/ pass the subcommand:
# `devheal controller`, `devheal agent`, `devheal launch`, `devheal barrier`, `devheal sidecar`.
# Build: docker build -t devheal:0.1.0 .   (docs/install.md; tests/unit/packaging checks this file.)
#
# The base is pinned to an exact Python release (the one requirements*.lock are compiled for:
# 3.11); pin it by digest too where the registry is reachable (PYTHON_IMAGE=...@sha256:...).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# Stage 1: build the wheel with the locked, hash-checked build requirements. The build hook
# (hatch_build.py) generates the pod-resources gRPC code from api.proto here.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements-build.lock requirements-runtime.lock ./
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements-build.lock
COPY pyproject.toml hatch_build.py README.md ./
COPY src ./src
RUN /opt/build/bin/pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /dist . \
 && cp requirements-runtime.lock /dist/

# Stage 2: the runtime. A virtualenv without pip holding the locked runtime dependencies
# and the wheel, byte-compiled at install so that nothing is written at run time.
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
COPY --from=build /dist /tmp/dist
RUN python -m venv --without-pip /opt/devheal \
 && python -m pip --python /opt/devheal/bin/python install --no-cache-dir --require-hashes --no-deps \
      -r /tmp/dist/requirements-runtime.lock \
 && python -m pip --python /opt/devheal/bin/python install --no-cache-dir --no-deps /tmp/dist/devheal-*.whl \
 && python -m pip --python /opt/devheal/bin/python check \
 && rm -rf /tmp/dist
# A read-only root file system: no byte-code writes, and anything that wants a home or a
# cache gets one under /tmp (an emptyDir where it is needed). No plotting library: the
# `plots` extra (matplotlib) is for `devheal simulate` on a workstation, not the cluster.
ENV PATH=/opt/devheal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
ENTRYPOINT ["devheal"]
CMD ["--help"]
