# Every target installs what it needs first: `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned to the CPU wheel this machine kind holds (an unpinned torch pulls CUDA wheels).
	$(BIN)/pip install --quiet "torch==2.13.0" -e ".[dev,torch,mindspore]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/python -m bisect_prefetch.demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks

lint: $(STAMP)
	$(BIN)/ruff check bisect_prefetch tests benchmarks

clean:
	rm -rf $(VENV) .bisect-prefetch
