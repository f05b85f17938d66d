# compressor_2: `make run` runs the main job, `make test` passes the tests.
# Both set up .venv first (idempotent: a no-op once requirements are installed).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?= .config
export KCONFIG_CONFIG := $(CONFIG)

.PHONY: install menuconfig defconfig savedefconfig olddefconfig test run bench

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
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
