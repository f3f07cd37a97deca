# Everything runs in a local virtual environment that these targets create on first use.
#   make lab    set up, then open the teaching notebook in JupyterLab
#   make demo   set up, then run a leaking loop under %%memwatch in plain IPython (headless)
#   make test   set up, then type-check (mypy, strict) and run the whole test suite (what .ci/run calls);
#               the kernel tests marked both_kernels run in ipykernel 7 and in ipykernel 6 (see ipykernel6)
#   make docs   set up, then build the documentation (docs/, mkdocs.yml) offline into site/; strict: a broken
#               link or anchor fails it
#   make notebooks  set up, then write every teaching notebook notebooks/NN_*.ipynb from its source, the
#               jupytext percent-format script notebooks/NN_*.py next to it (no outputs: edit the .py, not the .ipynb)
#   make bench  set up (with the peers the benchmark compares against, the `bench` extra), then run the
#               benchmarks and rewrite their tables in the docs pages (docs/benchmarks.md, docs/verdicts.md,
#               docs/leak-finder.md)
#   make screenshots  set up, then retake the README's screenshots (docs/images/) in JupyterLab in headless Chromium
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel this project is developed with; a plain `torch` would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# ipykernel 6 (no kernel subshells) for the kernel tests' matrix: a second venv with the same torch wheel, this
# checkout (editable) and ipykernel<7, as a user of ipykernel 6 has it (one environment: layering ipykernel 6
# over this venv through PYTHONPATH made its frames look like user code to the ranks' holder scans)
IPYKERNEL6 ?= .venv-ipykernel6
IPYKERNEL6_SPEC ?= ipykernel>=6.29,<7
IPYKERNEL6_STAMP := $(IPYKERNEL6)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# JupyterLab refuses to run as root unless told; containers and CI machines often are root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup ipykernel6 browser-deps lab demo notebooks test docs screenshots bench clean

setup: $(STAMP)

# pip 25.1 or newer reads the contributors' dependency groups from pyproject.toml (`--group`)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "pip>=25.1"
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[lab]" --group test --group docs "$(TORCH_SPEC)"
	touch $@

ipykernel6: $(IPYKERNEL6_STAMP)

$(IPYKERNEL6_STAMP): pyproject.toml
	rm -rf $(IPYKERNEL6)
	$(PYTHON) -m venv $(IPYKERNEL6)
	$(IPYKERNEL6)/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(IPYKERNEL6)/bin/python -m pip install --quiet --disable-pip-version-check -e . "$(TORCH_SPEC)" "$(IPYKERNEL6_SPEC)"
	$(IPYKERNEL6)/bin/python -c "import ipykernel; assert ipykernel.__version__.startswith('6.'), ipykernel.__version__; \
		print('ipykernel', ipykernel.__version__)"
	touch $@

lab: setup
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/01_memwatch_quickstart.ipynb

demo: setup
	$(BIN)/python examples/leak_demo.py

notebooks: setup
	$(BIN)/python tools/build_notebooks.py

browser-deps:
	tools/ensure_chromium.sh

test: setup ipykernel6 browser-deps
	$(BIN)/python -m mypy
	TORCHMEM_REQUIRE_IPYKERNEL6=1 $(BIN)/python -m pytest

docs: setup
	$(BIN)/python -m mkdocs build --strict --site-dir site

# the browser test that runs a leaking cell in JupyterLab writes its live-figure and report pictures there
screenshots: setup browser-deps
	TORCHMEM_UPDATE_SCREENSHOTS=1 $(BIN)/python -m pytest tests/browser/test_lab_live_figure.py \
		-k curves_grow_while_the_cell_is_busy

# ipyexperiments requires the `pynvml` package, now a deprecated shim over nvidia-ml-py (installed with it,
# same module) that warns on every `import pynvml`: torch's and our own NVML imports would then warn, and the
# test suite turns warnings into errors. The shim goes; the module stays.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PIP) --group bench "$(TORCH_SPEC)"
	$(BIN)/python -m pip uninstall --quiet --yes pynvml
	touch $@

bench: setup $(BENCH_STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(IPYKERNEL6) .pytest_cache site
