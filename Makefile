# Both targets set up .venv on first use (Python >= 3.11 and pip are all a fresh machine needs).
# `make demo` installs switchzoo and its runtime dependencies only; `make test` adds the test
# extra (transformers and torch, the Hugging Face parity oracle). TORCH names the torch to install
# first: a plain `torch` from PyPI pulls GBs of CUDA wheels on Linux, so elsewhere use the CPU
# build: make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
DEVICES := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: demo test docs figures bench bench-quick

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed      ## trains a small Switch translator on CPU, then BLEU + perplexity
	$(PY) train.py --config=configs/demo.py --workdir=workdirs/demo
	$(PY) eval.py --workdir=workdirs/demo

test: $(VENV)/.installed-test ## the test suite, on 8 simulated CPU devices
	$(DEVICES) $(PY) -m pytest -q -n 3 --dist worksteal --durations=10 tests

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.installed-docs ## the documentation site -> out/site (strict: a broken link fails)
	$(PY) -m switchzoo.config_reference > docs/config.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The committed figures in docs/figures change only when asked: make figures FIGURES=docs/figures
FIGURES ?= out/figures
figures: $(VENV)/.installed   ## the Mesh-TensorFlow paper's figures 2-4 -> out/figures (FIGURES=...)
	$(PY) examples/mtf_two_layer.py --out $(FIGURES)

bench: $(VENV)/.installed-test ## every benchmark -> out/bench/*.json, docs/benchmarks.md + plots
	$(PY) bench/run_all.py

bench-quick: $(VENV)/.installed-test ## the benchmarks at small sizes (checks that they run)
	$(PY) bench/run_all.py --quick --out out/bench-quick
