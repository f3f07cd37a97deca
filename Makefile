# Everything runs in a local virtual environment that these targets create on first use.
#   make lab    set up, then open the teaching notebook in JupyterLab
#   make demo   set up, then run a leaking loop under %%memwatch in plain IPython (headless)
#   make test   set up, then type-check (mypy, strict) and run the whole test suite (what .ci/run calls)
#   make bench  set up, then run the benchmarks and rewrite their table in README.md
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel this project is developed with; a plain `torch` would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# JupyterLab refuses to run as root unless told; containers and CI machines often are root
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup browser-deps lab demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test,lab]" "$(TORCH_SPEC)"
	touch $@

lab: setup
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/01_memwatch_quickstart.ipynb

demo: setup
	$(BIN)/python examples/leak_demo.py

browser-deps:
	tools/ensure_chromium.sh

test: setup browser-deps
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache
