# InstaSlice — one tool per target. Everything runs inside the project's own virtualenv.
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGES := api driver controller kubeletplugin instaslice localcluster protos
# mypy --strict covers the tests and benchmarks too (they are code we maintain)
TYPECHECKED := $(PACKAGES) tests bench
PYTEST_ARGS ?=
DEMO_ARGS ?=
SOAK_MINUTES ?= 20
SOAK_ARGS ?=

.PHONY: help install lock protos protos-check lint fmt typecheck test test-real test-deploy test-autoscale test-unit soak bench demo check-nvml clean

help: ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-28s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)

INSTALLED := $(VENV)/.installed
LOCKS := requirements/dev.lock requirements/product.lock requirements/build.lock
# The installed package is the product alone; the checkout's own packages that never ship
# (localcluster/, bench/, tests/) are found through this .pth file naming the checkout.
CHECKOUT_PTH = $(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "instaslice-checkout.pth").write_text("$(CURDIR)\n")'
# Every dependency (pip itself included) from the lock, exact versions and hashes; then the
# project itself, editable, without resolving anything again.
INSTALL_LOCKED = $(PY) -m pip install -q --require-hashes -r requirements/dev.lock \
	&& $(PY) -m pip install -q --no-deps --no-build-isolation -e . \
	&& $(CHECKOUT_PTH) && touch $(INSTALLED)

install: $(PY) ## create .venv with the project, its dev tools and matplotlib (simulate --plot), from requirements/dev.lock
	@$(INSTALL_LOCKED)

# what every target below needs when `make install` never ran (a fresh clone), or ran before
# pyproject.toml or the lock last changed
$(INSTALLED): pyproject.toml requirements/dev.lock | $(PY)
	@$(INSTALL_LOCKED)

# The lock's inputs: pyproject.toml's ranges. Universal: one file for every platform and
# architecture the images are built for, each version with all its files' hashes.
# dev.lock adds the dev tools and the plots extra (matplotlib, for `instaslice simulate --plot`);
# the images install product.lock only.
UV_COMPILE = $(PY) -m uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock'
lock: $(PY) ## re-resolve requirements/*.lock from pyproject.toml (newest allowed versions); then `make protos`
	$(PY) -m pip show -q uv >/dev/null 2>&1 || $(PY) -m pip install -q uv
	$(UV_COMPILE) --upgrade pyproject.toml -o requirements/product.lock
	$(UV_COMPILE) --upgrade pyproject.toml --extra dev --extra plots -c requirements/product.lock \
	  -o requirements/dev.lock.in-progress \
	  requirements/tools.in
	mv requirements/dev.lock.in-progress requirements/dev.lock
	$(UV_COMPILE) --upgrade requirements/build.in -c requirements/dev.lock -o requirements/build.lock

protos: $(INSTALLED) ## regenerate the gRPC stubs from the .proto files (protos/: the kubelet's APIs; tests/autoscale/protos/: the test cloud provider's)
	$(PY) -m protos.generate

protos-check: $(INSTALLED) ## fail, listing them, when committed gRPC stubs differ from what `make protos` writes; touches nothing
	$(PY) -m protos.generate --check

lint: $(INSTALLED) ## ruff check + format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: ## ruff format + autofix
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: $(INSTALLED) ## mypy --strict over our packages, tests and benchmarks (generated stubs excluded)
	$(PY) -m mypy $(TYPECHECKED)

test: $(INSTALLED) ## the whole test suite (unit, contract, integration, end-to-end on the local cluster)
	$(PY) -m pytest $(PYTEST_ARGS)

test-real: $(INSTALLED) ## the real-stack tier (tests/real) on Kubernetes built by ../shared/realstack; skips in one line when not built
	@reason=$$($(PY) -c 'from localcluster.realstack import describe_missing; print(describe_missing() or "")'); \
	if [ -n "$$reason" ]; then echo "test-real: skipped: $$reason"; \
	else $(PY) -m pytest tests/real --real-stack -p no:cacheprovider $(PYTEST_ARGS); fi

test-autoscale: $(INSTALLED) ## cluster-autoscaler (externalgrpc) growing and shrinking the real stack, both modes (tests/autoscale/real, ~25 min); skips in one line when not built
	@reason=$$($(PY) -c 'from tests.autoscale.autoscaler import describe_missing; print(describe_missing() or "")'); \
	if [ -n "$$reason" ]; then echo "test-autoscale: skipped: $$reason"; \
	else $(PY) -m pytest tests/autoscale/real --autoscale -p no:cacheprovider $(PYTEST_ARGS); fi

soak: $(INSTALLED) ## SOAK_MINUTES (20) of churn and faults on the real stack, invariants and daemon growth checked (docs/reliability.md); skips in one line when not built
	@reason=$$($(PY) -c 'from localcluster.realstack import describe_missing; print(describe_missing() or "")'); \
	if [ -n "$$reason" ]; then echo "soak: skipped: $$reason"; \
	else $(PY) -m localcluster.soak --minutes $(SOAK_MINUTES) $(SOAK_ARGS); fi

# The deploy tier's images (built by `make images` outside the lock) and the real stack's lock,
# held while its pytest runs (REALSTACK_LOCK= when the caller already holds it).
DEPLOY_TEST_IMG ?= localhost/instaslice-controller:deploy-test
DEPLOY_TEST_IMG_PLUGIN ?= localhost/instaslice-kubelet-plugin:deploy-test
REALSTACK_LOCK ?= /tmp/realstack.lock
test-deploy: $(INSTALLED) ## the deploy tier (tests/deployed): images built here, `make deploy` on containerd nodes, lifecycle; skips in one line when those nodes are not built
	@reason=$$($(PY) -c 'from localcluster.containerstack import describe_missing; print(describe_missing() or "")'); \
	if [ -n "$$reason" ]; then echo "test-deploy: skipped: $$reason"; \
	else $(call build_images,$(DEPLOY_TEST_IMG),$(DEPLOY_TEST_IMG_PLUGIN)) \
	  && INSTASLICE_DEPLOY_IMG=$(DEPLOY_TEST_IMG) INSTASLICE_DEPLOY_IMG_PLUGIN=$(DEPLOY_TEST_IMG_PLUGIN) \
	  $(if $(REALSTACK_LOCK),flock -w 3600 -o $(REALSTACK_LOCK)) \
	  $(PY) -m pytest tests/deployed --deploy-tier -p no:cacheprovider $(PYTEST_ARGS); fi

bench: $(INSTALLED) ## run the benchmarks; figures go to stdout and bench/results/*.json
	$(PY) -m bench

demo: $(INSTALLED) ## the whole system on this machine: real controller + kubelet plugins, emulated GPUs, samples/ applied and removed (e.g. make demo DEMO_ARGS="--nodes 4 --gpus A100-40GB,H100-80GB --fast")
	$(PY) -m localcluster.demo $(DEMO_ARGS)

check-nvml: $(INSTALLED) ## read-only NVML discovery on a real GPU host (never changes MIG state)
	$(PY) -m pytest -m gpu tests/contract -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis

##@ Images and cluster deployment (deploy/, samples/, docs/deploy.md)
# `make install` above sets up the virtualenv; the cluster-scoped API objects of InstaSlice (its
# DeviceClasses) are installed with `make deploy-classes` (also part of `make deploy`).
IMG ?= quay.io/instaslice/instaslice-controller:latest
IMG_PLUGIN ?= quay.io/instaslice/instaslice-kubelet-plugin:latest
CONTAINER_TOOL ?= docker
PLATFORMS ?= linux/amd64,linux/arm64
KUBECTL ?= kubectl
KIND ?= kind
KIND_CLUSTER ?= instaslice
KIND_NODE_IMAGE ?= kindest/node:v1.35.0
OVERLAY ?= gpu
EMULATED_GPUS ?=
COMPONENTS ?=
RENDER = IMG='$(IMG)' IMG_PLUGIN='$(IMG_PLUGIN)' EMULATED_GPUS='$(EMULATED_GPUS)' COMPONENTS='$(COMPONENTS)' KUBECTL='$(KUBECTL)' deploy/render.sh

.PHONY: deviceclasses monitoring images docker-build docker-push docker-buildx manifests deploy deploy-emulated undeploy deploy-classes undeploy-classes test-e2e-kind-emulated cleanup-test-e2e-kind-emulated test-deploy

deviceclasses: $(INSTALLED) ## regenerate deploy/base/deviceclasses.yaml (and the extendedResourceName patches) from the MIG catalog
	$(PY) deploy/generate_deviceclasses.py

monitoring: $(INSTALLED) ## regenerate the monitoring component's PrometheusRule and Grafana dashboard (deploy/components/monitoring)
	$(PY) deploy/components/monitoring/generate.py

BUILDAH ?= buildah
# The build stage's pip reaches PyPI through the host's network.
BUILDAH_FLAGS ?= --network host
# build_images CONTROLLER,PLUGIN: both targets of the Dockerfile, then their sizes
build_images = $(BUILDAH) bud $(BUILDAH_FLAGS) --layers --target controller -t $(1) . \
	&& $(BUILDAH) bud $(BUILDAH_FLAGS) --layers --target kubelet-plugin -t $(2) . \
	&& for image in $(1) $(2); do \
	  echo "$$image  $$($(BUILDAH) images --format '{{.Size}}' $$image | head -1)"; done
images: ## build both images with buildah (no daemon): IMG (controller) and IMG_PLUGIN (kubelet plugin), then print their sizes
	$(call build_images,$(IMG),$(IMG_PLUGIN))

docker-build: ## build both images: IMG (controller) and IMG_PLUGIN (kubelet plugin); CONTAINER_TOOL=podman works
	$(CONTAINER_TOOL) build --target controller -t $(IMG) .
	$(CONTAINER_TOOL) build --target kubelet-plugin -t $(IMG_PLUGIN) .

docker-push: ## push IMG and IMG_PLUGIN
	$(CONTAINER_TOOL) push $(IMG)
	$(CONTAINER_TOOL) push $(IMG_PLUGIN)

docker-buildx: ## build and push multi-arch images for PLATFORMS (docker buildx, or podman manifests)
ifeq ($(notdir $(CONTAINER_TOOL)),podman)
	for target_image in controller=$(IMG) kubelet-plugin=$(IMG_PLUGIN); do \
	  target=$${target_image%%=*}; image=$${target_image#*=}; \
	  podman manifest rm $$image 2>/dev/null || true; \
	  podman build --platform $(PLATFORMS) --target $$target --manifest $$image . && \
	  podman manifest push --all $$image $$image || exit 1; \
	done
else
	- $(CONTAINER_TOOL) buildx create --name instaslice-builder
	$(CONTAINER_TOOL) buildx use instaslice-builder
	$(CONTAINER_TOOL) buildx build --push --platform $(PLATFORMS) --target controller -t $(IMG) .
	$(CONTAINER_TOOL) buildx build --push --platform $(PLATFORMS) --target kubelet-plugin -t $(IMG_PLUGIN) .
	- $(CONTAINER_TOOL) buildx rm instaslice-builder
endif

manifests: ## print what `make deploy` applies (OVERLAY=gpu|emulated|scheduler-native|scheduler-native-emulated, IMG, IMG_PLUGIN, EMULATED_GPUS, COMPONENTS)
	@$(RENDER) $(OVERLAY)

deploy: ## deploy InstaSlice with kustomize overlay OVERLAY (default gpu) and the images IMG / IMG_PLUGIN; waits for the rollout and says why it cannot finish
	$(RENDER) $(OVERLAY) | $(KUBECTL) apply -f -
	KUBECTL='$(KUBECTL)' deploy/rollout.sh

deploy-emulated: ## deploy on a cluster without GPUs (KinD): emulated GPUs, EMULATED_GPUS per node (default 2xA100-40GB)
	$(MAKE) deploy OVERLAY=emulated

DRAIN ?= false
undeploy: $(INSTALLED) ## remove InstaSlice; refuses (listing them) while pods hold MIG slices, DRAIN=true evicts them first (docs/deploy.md "Uninstall")
	@# rendered first: a render that fails (a mistyped OVERLAY) must stop here, not feed nothing on
	@manifests=$$($(RENDER) $(OVERLAY)) && printf '%s\n' "$$manifests" \
	  | $(PY) -m instaslice uninstall -f - $(if $(filter true,$(DRAIN)),--drain)

deploy-classes: ## install only the cluster-scoped API objects: the DeviceClasses (what `install` is in kubebuilder projects)
	$(KUBECTL) apply -f deploy/base/deviceclasses.yaml

undeploy-classes: ## remove the DeviceClasses
	$(KUBECTL) delete --ignore-not-found -f deploy/base/deviceclasses.yaml

test-e2e-kind-emulated: docker-build ## KinD without GPUs: cluster, images, emulated overlay, samples/, check placement
	KIND_CLUSTER='$(KIND_CLUSTER)' KIND_NODE_IMAGE='$(KIND_NODE_IMAGE)' IMG='$(IMG)' IMG_PLUGIN='$(IMG_PLUGIN)' \
	  CONTAINER_TOOL='$(CONTAINER_TOOL)' KIND='$(KIND)' KUBECTL='$(KUBECTL)' deploy/e2e-kind-emulated.sh

cleanup-test-e2e-kind-emulated: ## delete the KinD cluster of test-e2e-kind-emulated
	$(if $(filter podman,$(notdir $(CONTAINER_TOOL))),KIND_EXPERIMENTAL_PROVIDER=podman) $(KIND) delete cluster --name $(KIND_CLUSTER)
