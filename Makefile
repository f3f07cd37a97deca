# Everything runs in a local virtual environment that these targets create on first use.
#   make lab    set up, then open the teaching notebook in JupyterLab
#   make demo   set up, then run a leaking loop under %%memwatch in plain IPython (headless)
#   make check  set up, then the fast tier (under a minute): lint (ruff), types (mypy, strict), the pure core's tests
#   make test   set up, then type-check (mypy, strict) and run the whole test suite (what .ci/run calls);
#               the kernel tests marked `floors` run again in a kernel of the floors venv, and the tests of what
#               leans on the widget libraries, psutil and torch internals run inside it (see floors); those
#               marked `ipykernel70` run again in a kernel of ipykernel 7.0.0 (see ipykernel70)
#   make docs   set up, then build the documentation (docs/, mkdocs.yml) offline into site/; strict: a broken
#               link or anchor fails it
#   make notebooks  set up, then write every teaching notebook notebooks/NN_*.ipynb from its source, the
#               jupytext percent-format script notebooks/NN_*.py next to it (no outputs: edit the .py, not the .ipynb)
#   make bench  set up (with the peers the benchmark compares against, the `bench` group), then run the
#               benchmarks and rewrite their tables in the docs pages (docs/benchmarks.md, docs/verdicts.md,
#               docs/leak-finder.md)
#   make bench-check  set up (no peers needed: the kernel client and ipykernel come with the test group), then
#               run a quick version of the benchmarks (~3 minutes on a quiet machine) and fail when a figure passes its goal or
#               regresses past its stored baseline (bench/goals.json; docs/benchmarks.md, "Checking for
#               regressions"); not part of `make test`: too long for CI
#   make faults  set up (the kernel client and ipykernel come with the test group), then run the fault campaign
#               (bench/faults.py: each fault 30 times in a real kernel beside 2 CPU burners, ~25 minutes here; as root it
#               mounts the small filesystems some faults need) and rewrite its table in docs/faults.md; not part of
#               `make test` or `make bench`: too long
#   make screenshots  set up, then retake the README's screenshots (docs/images/) in JupyterLab in headless Chromium
#   make stress-holders  set up, then run every holder test of the framework and kernel tiers (HOLDER_TESTS)
#               3 times beside 2 CPU burners and fail on any test whose outcome flips between the runs (or that
#               fails in all of them); not part of `make test`
#   make catalogue  set up, then run the holder catalogue's kernel test 3 times and write its table, with each
#               loop's passes, into docs/leak-finder.md; not part of `make test`
#   make stress  slow (about two hours here): stress-timing, then stress-full; fails on any failure
#               (tools/stress); not part of `make test`
#   make stress-timing  slow (about an hour here): beside a CPU burner, run the timing-sensitive tests (STRESS_TESTS)
#               10 times in a row; fails on a test that fails in any of them
#   make stress-full  slow (about an hour and ten minutes here): beside a CPU burner, run `make test` 3 times in a row; fails on
#               any red run
#   make device-check  on a machine with a CUDA GPU: check what only a real device shows (tools/device_check),
#               with the machine's own python3 and torch (no venv: a CUDA torch is what it needs); writes
#               device_check.json and device_check.txt (see docs/layout.md, "GPU check")
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel this project is developed with; a plain `torch` would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The oldest supported stack: IPython, ipywidgets, bqplot, psutil and ipykernel 6 (no kernel subshells) at the
# floors pinned in constraints/minimum.txt, with the newer torch build (the other release whose internals the
# hooks lean on), and this checkout (editable), as a user of those versions has them in one environment
# (layering them over this venv through PYTHONPATH made their frames look like user code to the ranks' scans)
FLOORS ?= .venv-floors
FLOORS_TORCH_SPEC ?= torch==2.14.1
FLOORS_STAMP := $(FLOORS)/.installed
# run inside the floors venv: the live figure's widgets, the probes, the hooks on torch's internals, and torchrun
# ranks watched from the command line (torch.distributed.elastic's launcher)
FLOORS_TESTS ?= tests/torch/test_hooks.py tests/torch/test_missing_internals.py tests/torch/test_live.py \
	tests/torch/test_live_ranks.py tests/torch/test_probes.py tests/cli/test_watch_ranks.py
# ipykernel 7.0.0 (its threads' messages look their parent up in the sending thread's context; 7.1 changed that)
# with the newest of everything else, the main venv's torch and this checkout (editable): the kernel tests marked
# `ipykernel70` (the live figure's updates, which thread sends them, and that they reach the client mid-run) run
# again in a kernel of it, from the main venv's pytest (about a minute to build with pip's cache warm)
IPYKERNEL70 ?= .venv-ipykernel70
IPYKERNEL70_STAMP := $(IPYKERNEL70)/.installed
# The pure core (tests/core) on every supported Python: a venv per interpreter with pytest only and the package
# installed from this checkout without its dependencies (no torch, IPython, psutil, numpy, widgets), the tests run
# from outside the checkout against that installed copy. This project's 3.11 is the main venv.
CORE_PYTHONS ?= 3.10 3.12 3.13
PYENV_ROOT ?= /root/.pyenv
CORE_VENVS := $(foreach v,$(CORE_PYTHONS),.venv-py$(v))
CORE_SOURCES := pyproject.toml $(shell find torchmem_magic -name '*.py' -o -name py.typed)
BENCH_STAMP := $(VENV)/.installed-bench
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# JupyterLab refuses to run as root unless told; containers and CI machines often are root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: check setup floors ipykernel70 core browser-deps lab demo notebooks test docs screenshots bench bench-check faults stress-holders catalogue stress stress-timing stress-full device-check clean

setup: $(STAMP)

# pip 25.1 or newer reads the contributors' dependency groups from pyproject.toml (`--group`)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "pip>=25.1"
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[lab]" --group test --group docs "$(TORCH_SPEC)"
	touch $@

floors: $(FLOORS_STAMP)

$(FLOORS_STAMP): pyproject.toml constraints/minimum.txt
	rm -rf $(FLOORS)
	$(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints/minimum.txt \
		"$(FLOORS_TORCH_SPEC)" -e . ipykernel "pytest>=8"
	$(FLOORS)/bin/python -m pip check
	touch $@

ipykernel70: $(IPYKERNEL70_STAMP)

$(IPYKERNEL70_STAMP): pyproject.toml
	rm -rf $(IPYKERNEL70)
	$(PYTHON) -m venv $(IPYKERNEL70)
	$(IPYKERNEL70)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)" -e . \
		ipykernel==7.0.0 "pytest>=8"
	$(IPYKERNEL70)/bin/python -m pip check
	touch $@

core: $(foreach v,$(CORE_VENVS),$(v)/.package)

# each interpreter from pyenv where it has one (the newest patch release), else pythonX.Y on PATH
.venv-py%/.installed:
	rm -rf .venv-py$*
	$(or $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$*.*/bin/python3))),python$*) -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install --quiet --disable-pip-version-check "pytest>=8"
	touch $@

# reinstalled (a wheel built from the checkout, a few seconds) whenever the package's files change; the build
# directory goes first: setuptools copies the sources into build/lib over what an earlier build left there, so
# modules since moved or removed would be installed too
.venv-py%/.package: .venv-py%/.installed $(CORE_SOURCES)
	rm -rf build
	.venv-py$*/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall .
	touch $@

.PRECIOUS: .venv-py%/.installed .venv-py%/.package

lab: setup
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/01_memwatch_quickstart.ipynb

demo: setup
	$(BIN)/python examples/leak_demo.py

notebooks: setup
	$(BIN)/python tools/build_notebooks.py

browser-deps:
	tools/ensure_chromium.sh

check: setup
	$(BIN)/python -m ruff check
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/core

test: setup floors ipykernel70 core browser-deps
	$(BIN)/python -m ruff check
	$(BIN)/python -m mypy
	TORCHMEM_REQUIRE_FLOORS=1 $(BIN)/python -m pytest
	$(FLOORS)/bin/python -m pytest -p no:cacheprovider $(FLOORS_TESTS)
	set -e; outside=$$(mktemp -d); for venv in $(CORE_VENVS); do \
		(cd $$outside && TORCHMEM_CORE_INSTALLED=1 $(CURDIR)/$$venv/bin/python -m pytest -q -p no:cacheprovider $(CURDIR)/tests/core); \
	done; rm -rf $$outside

docs: setup
	$(BIN)/python -m mkdocs build --strict --site-dir site

# the browser tests that run a leaking cell in JupyterLab, and open a leaking loop's scalars in TensorBoard,
# write the pictures the docs show there
screenshots: setup browser-deps
	TORCHMEM_UPDATE_SCREENSHOTS=1 $(BIN)/python -m pytest tests/browser/test_lab_live_figure.py \
		-k curves_grow_while_the_cell_is_busy
	TORCHMEM_UPDATE_SCREENSHOTS=1 $(BIN)/python -m pytest tests/browser/test_tensorboard_scalars.py

# ipyexperiments requires the `pynvml` package, now a deprecated shim over nvidia-ml-py (installed with it,
# same module) that warns on every `import pynvml`: torch's and our own NVML imports would then warn, and the
# test suite turns warnings into errors. The shim goes; the module stays.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PIP) --group bench "$(TORCH_SPEC)"
	$(BIN)/python -m pip uninstall --quiet --yes pynvml
	touch $@

bench: setup $(BENCH_STAMP)
	$(BIN)/python bench/run_all.py

bench-check: setup
	$(BIN)/python bench/check.py

faults: setup
	$(BIN)/python bench/faults.py

# every holder test of the framework and kernel tiers (make stress-holders)
HOLDER_TESTS ?= tests/kernel/test_framework_loops.py tests/kernel/test_holder_catalogue.py \
	tests/kernel/test_holders_found_elsewhere.py tests/kernel/test_holders_where_frameworks_keep_them.py \
	tests/kernel/test_leak_finder.py tests/kernel/test_holder_cycles.py tests/torch/test_holders.py

stress-holders: setup
	PYTHON=$(BIN)/python STRESS_TESTS="$(HOLDER_TESTS)" tools/stress 2 3 0

catalogue: setup
	$(BIN)/python tools/catalogue_table.py 3

# the tests a busy machine could move: the browser, kernel timing, DataLoader workers and their deaths, the guard,
# live ranks, holder scans, scan budgets, the terminal status, the sampler's listener rate
STRESS_TESTS ?= tests/browser tests/kernel/test_dataloader.py tests/kernel/test_verdicts.py \
	tests/kernel/test_framework_loops.py tests/kernel/test_guard_kernel.py tests/kernel/test_ranks_live.py \
	tests/kernel/test_widget_models.py tests/torch/test_scan.py tests/cli/test_watch_status.py \
	tests/kernel/test_live_update_threads.py tests/torch/test_routed_updates.py tests/core/test_sampler.py

stress: stress-timing stress-full

stress-timing: setup floors ipykernel70 browser-deps
	PYTHON=$(BIN)/python STRESS_TESTS="$(STRESS_TESTS)" tools/stress 1 10 0

stress-full: setup
	PYTHON=$(BIN)/python MAKE="$(MAKE)" tools/stress 1 0 3

device-check:
	$(PYTHON) tools/device_check --out device_check.json

clean:
	rm -rf $(VENV) $(FLOORS) $(IPYKERNEL70) $(CORE_VENVS) .pytest_cache site
