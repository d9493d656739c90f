# Every target installs what it needs first: `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The MindFormers reference workload's own venv: MindFormers 1.9 needs MindSpore 2.9
# (the main venv has 2.10). About 80-170 s and 3.4 GB.
MF_VENV := .venv-mindformers
MF_STAMP := $(MF_VENV)/.installed
# Real torchtitan 0.3.0 as a client job (tests/e2e/test_torchtitan.py, benchmarks/bench_torchtitan.py),
# in a venv of its own: the tool's venv is never on its path. torchtitan declares neither torch
# nor triton but imports triton unconditionally; torch goes first so pip keeps the CPU wheel.
# About 2.5 GB.
TT_VENV := .venv-torchtitan
TT_STAMP := $(TT_VENV)/.installed
# FSDP2 jobs in venvs of their own with the lowest torch the adapter supports and the newest
# the package index serves here by default (tests/e2e/test_torch_versions.py). Both are CUDA
# builds that run on CPU, with their NVIDIA libraries (torch does not import without them):
# 2.8.0 (public index) 88-155 s and 6.5 GB, 2.14.1 (this machine's disk) 45-344 s and 5.4 GB
# (load 2 to 8 on 2 cores). numpy as in a user's venv (torch warns at import without it).
TORCH_LOW := 2.8.0
TORCH_HIGH := 2.14.1
LOW_VENV := .venv-torch-$(TORCH_LOW)
HIGH_VENV := .venv-torch-$(TORCH_HIGH)
TORCH_STAMPS := $(LOW_VENV)/.installed $(HIGH_VENV)/.installed

.PHONY: install slurm browser mindformers-venv torchtitan-venv torch-venvs e2e-setup test test-fast demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned to the CPU wheel this machine kind holds (an unpinned torch pulls CUDA wheels).
	$(BIN)/pip install --quiet "torch==2.13.0" -e ".[dev,torch,mindspore]"
	touch $(STAMP)

mindformers-venv: $(MF_STAMP)

$(MF_STAMP):
	.ci/need-disk 5 "building $(MF_VENV)"
	$(PYTHON) -m venv $(MF_VENV)
	$(MF_VENV)/bin/pip install --quiet --no-cache-dir "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"
	touch $(MF_STAMP)

torchtitan-venv: $(TT_STAMP)

$(TT_STAMP):
	.ci/need-disk 4 "building $(TT_VENV)"
	$(PYTHON) -m venv $(TT_VENV)
	$(TT_VENV)/bin/pip install --quiet --no-cache-dir "torch==2.13.0"
	# tokenizers: the tests build torchtitan's tokenizer assets locally with it.
	$(TT_VENV)/bin/pip install --quiet --no-cache-dir "torchtitan==0.3.0" "triton==3.9.0" tokenizers
	touch $(TT_STAMP)

torch-venvs: $(TORCH_STAMPS)

# --no-cache-dir: pip would keep a second copy of the downloaded wheels (about 3 GB for 2.8.0).
.venv-torch-%/.installed:
	.ci/need-disk 10 "building .venv-torch-$*"
	$(PYTHON) -m venv .venv-torch-$*
	.venv-torch-$*/bin/pip install --quiet --no-cache-dir "torch==$*" numpy
	touch $@

# The tests start a real Slurm (one node; two nodes in network namespaces): Debian's slurm-wlm and munge, installed when missing.
slurm:
	.ci/install-slurm

# The report is checked in a real browser: Debian's chromium, installed when missing.
browser:
	.ci/install-chromium

# What tests/e2e needs besides the tool's venv: about 18 GB of job venvs, Slurm and chromium.
e2e-setup: slurm browser $(MF_STAMP) $(TT_STAMP) $(TORCH_STAMPS)

# The folder decides speed (tests/conftest.py): the fast tests first, then tests/e2e (real
# training runs, a real Slurm, a browser), which starts only when the fast tests passed.
# Both run on 2 workers (pytest-xdist), each its own process with temp dirs of its own: the
# fast tests one test at a time, tests/e2e one file at a time, every Slurm file on one worker
# (tests/conftest.py). On 2 cores the fast tests took half the time of one worker; the e2e
# runs wait on start-ups and on Slurm about a third of their time.
# The fast tests need none of e2e-setup, so it runs beside them (4 min 29 s on a fresh clone
# here, Slurm and chromium already installed), its output in E2E_SETUP_LOG.
# A skipped test fails here (tests/conftest.py): `make test` means the real engines ran.
E2E_SETUP_LOG := .bisect-prefetch/e2e-setup.log
test: $(STAMP)
	@mkdir -p $(dir $(E2E_SETUP_LOG))
	@echo "e2e set-up (make e2e-setup) runs beside the fast tests; its log: $(E2E_SETUP_LOG)"
	@$(MAKE) --no-print-directory e2e-setup > $(E2E_SETUP_LOG) 2>&1 & setup=$$!; \
	BISECT_PREFETCH_NO_SKIPS=1 $(BIN)/python -m pytest -q -n 2 --ignore=tests/e2e; fast=$$?; \
	wait $$setup || { tail -n 20 $(E2E_SETUP_LOG); \
		echo "make test: e2e set-up failed (the lines above; all of it in $(E2E_SETUP_LOG))" >&2; \
		exit 2; }; \
	[ $$fast -eq 0 ] || exit $$fast
	BISECT_PREFETCH_NO_SKIPS=1 $(BIN)/python -m pytest -q -n 2 --dist loadscope tests/e2e

# The fast tests alone, for iteration: the suite without tests/e2e.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --ignore=tests/e2e

# The main job on the reference workload: bisect the FSDP2 workload with a planted
# fault. Exit code 1 means "culprit found", which is the demo's expected ending.
# Run again, it resumes from its journal; `make clean` starts over.
# Then the same search with one mask a run, and the two side by side (runs launched, steps).
demo: $(STAMP)
	$(BIN)/bisect-prefetch bisect configs/fsdp2-fault.yaml --resume --state-dir .bisect-prefetch/demo \
		--json .bisect-prefetch/demo/bisect-result.json; rc=$$?; [ $$rc -le 1 ]
	$(BIN)/bisect-prefetch bisect configs/fsdp2-fault.yaml --segments off --resume \
		--state-dir .bisect-prefetch/demo-one-mask \
		--json .bisect-prefetch/demo-one-mask/bisect-result.json; rc=$$?; [ $$rc -le 1 ]
	$(BIN)/python -m benchmarks.demo_side_by_side .bisect-prefetch/demo/bisect-result.json \
		.bisect-prefetch/demo-one-mask/bisect-result.json

bench: $(STAMP) $(MF_STAMP) $(TT_STAMP) slurm
	$(BIN)/python -m benchmarks

lint: $(STAMP)
	$(BIN)/ruff check bisect_prefetch tests benchmarks examples

clean:
	rm -rf $(VENV) $(MF_VENV) $(TT_VENV) .venv-torch-* .bisect-prefetch
