# InstaSlice — one tool per target. Everything runs inside the project's own virtualenv.
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGES := api driver controller kubeletplugin localcluster protos
PYTEST_ARGS ?=

.PHONY: help install protos protos-check lint fmt typecheck test test-unit bench demo check-nvml clean

help: ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-28s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

install: $(PY) ## create .venv and install the project with its dev tools
	$(PY) -m pip install -q -e '.[dev]'

protos: ## regenerate the kubelet API stubs in protos/ from the .proto files
	$(PY) -m protos.generate

lint: ## ruff check + format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: ## ruff format + autofix
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: ## mypy --strict over our packages (generated stubs excluded)
	$(PY) -m mypy $(PACKAGES)

test: ## the whole test suite (unit, contract, integration, end-to-end on the local cluster)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: ## run the benchmarks; figures go to stdout and bench/results/*.json
	$(PY) -m bench

check-nvml: ## read-only NVML discovery on a real GPU host (never changes MIG state)
	$(PY) -m pytest -m gpu tests/contract -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis
