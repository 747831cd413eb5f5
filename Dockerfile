# syntax=docker/dockerfile:1
# InstaSlice images: one Dockerfile, two targets.
#   docker build --target controller     -t quay.io/instaslice/instaslice-controller:latest .
#   docker build --target kubelet-plugin -t quay.io/instaslice/instaslice-kubelet-plugin:latest .
# (`make images` builds both with buildah, no daemon; `make docker-build`; `make docker-buildx
# PLATFORMS=linux/amd64,linux/arm64` for multi-arch.)
# The Python package is built once into a virtualenv in the build stage and copied into a slim
# runtime; no compiler, installer, pip cache or source tree ends up in the images. Only the product's packages
# are copied: the local cluster emulator (localcluster/), bench/ and tests/ never ship.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Two virtualenvs: /opt/instaslice is what ships, with no installer in it (--without-pip: no pip,
# no setuptools); /opt/build holds pip and the build backend, and installs into the other one
# (pip --python).
RUN python -m venv --without-pip /opt/instaslice && python -m venv /opt/build
WORKDIR /src
# Dependencies first (their layer survives source edits), exactly as locked: versions and hashes.
# The kubernetes distribution carries an asyncio client (kubernetes/aio, about half its size) that
# `import kubernetes` never loads and no daemon uses; it goes, with the packages only it needs
# (aiohttp and its dependencies, "via aiohttp" in the lock). `make images` checks that every module
# the daemons load still imports.
COPY requirements/product.lock requirements/build.lock requirements/
RUN /opt/build/bin/pip install -q --require-hashes --no-deps -r requirements/build.lock \
 && /opt/build/bin/pip --python /opt/instaslice/bin/python \
      install -q --require-hashes --no-deps -r requirements/product.lock \
 && /opt/build/bin/pip --python /opt/instaslice/bin/python uninstall -q -y \
      aiohttp aiohttp-retry aiosignal aiohappyeyeballs attrs frozenlist multidict propcache yarl \
 && rm -r "$(/opt/instaslice/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/kubernetes/aio"
COPY pyproject.toml README.md ./
COPY api/ api/
COPY driver/ driver/
COPY protos/ protos/
COPY controller/ controller/
COPY kubeletplugin/ kubeletplugin/
COPY instaslice/ instaslice/
RUN /opt/build/bin/pip wheel -q --no-deps --no-build-isolation --wheel-dir /tmp/wheel . \
 && /opt/build/bin/pip --python /opt/instaslice/bin/python install -q --no-deps /tmp/wheel/*.whl \
 && /opt/instaslice/bin/instaslice --help >/dev/null \
 && cd / && /opt/instaslice/bin/python -c 'import importlib, pkgutil; [importlib.import_module(m.name) \
      for p in ("api", "driver", "controller", "kubeletplugin", "instaslice", "protos") \
      for m in pkgutil.walk_packages(importlib.import_module(p).__path__, p + ".") \
      if m.name not in ("instaslice.__main__", "protos.generate")]'

FROM python:${PYTHON_VERSION}-slim AS runtime
COPY --from=build /opt/instaslice /opt/instaslice
# Bytecode was compiled at install time; never write it at run time (read-only root filesystem).
ENV PATH=/opt/instaslice/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="InstaSlice" \
      org.opencontainers.image.description="Kubernetes DRA driver that creates NVIDIA MIG slices on demand" \
      org.opencontainers.image.licenses="Apache-2.0"

# The node agent. It runs as root: the kubelet's plugin directories and sockets (plugins_registry,
# device-plugins/kubelet.sock, pod-resources/kubelet.sock) are owned by root with modes 0700/0750,
# and NVML's MIG management needs root. The DaemonSet drops every capability in the emulated
# overlay; only the gpu overlay makes it privileged (see deploy/overlays/gpu).
FROM runtime AS kubelet-plugin
USER 0:0
ENTRYPOINT ["instaslice-kubelet-plugin"]

# The controller needs nothing from the host: a fixed unprivileged user (matches the Deployment's
# runAsUser; "nonroot" in distroless images).
FROM runtime AS controller
USER 65532:65532
ENTRYPOINT ["instaslice-controller"]
