# compressor_2: `make run` runs the main job, `make test` passes the tests.
# Both set up .venv first (idempotent: a no-op once requirements are installed).
# `make install-gpu` sets up .venv with the SGLang server instead (GPU machines).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?= .config
export KCONFIG_CONFIG := $(CONFIG)

.PHONY: install install-gpu menuconfig defconfig savedefconfig olddefconfig test run bench

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
	@# tmux drives menuconfig in the tests; best effort where apt is available.
	@command -v tmux >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || \
	  echo "note: tmux not installed; the menuconfig test will skip"; }
	@# Debian's chromium renders report.html in the browser test; best effort likewise.
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	  echo "note: chromium not installed; the report's browser test will skip"; }
	@touch $(STAMP)

# sglang 0.5.23 ships for CPython 3.11 only: `make install-gpu PYTHON=python3.11` where
# python3 is another version.
install-gpu:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import sys; sys.exit(sys.version_info[:2] != (3, 11))" || { \
	  echo "make install-gpu: sglang 0.5.23 needs CPython 3.11 but $(VENV) has $$($(PY) -V 2>&1);" \
	  "remove $(VENV) and run: make install-gpu PYTHON=python3.11"; exit 2; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-gpu.txt
	@rm -f $(STAMP)
	@$(MAKE) --no-print-directory install

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

test: $(STAMP)
	$(PY) -m pytest -q tests

run: $(STAMP) $(CONFIG)
	$(PY) -m compressor_2 evolve --config $(CONFIG)

bench: $(STAMP)
	@# The optimiser comparison runs its quick mode here; its full run takes ~30 minutes.
	@for b in benchmarks/bench_*.py benchmarks/calibrate_judge.py; do \
	  args=; [ $$b = benchmarks/bench_optimisers.py ] && args=--quick; \
	  echo "== $$b $$args"; $(PY) $$b $$args || exit 1; done
