# Quick start: `make demo` and `make test` each work on a fresh machine.
# The CPU torch is installed first and pinned, so nothing can pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

export MUJOCO_GL ?= egl

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]" "$(TORCH)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/wmrl demo --out runs/demo --overwrite

test: $(STAMP)
	$(BIN)/lint-imports --no-cache  # the layer contract in pyproject.toml: an upward import fails the build
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]" "$(TORCH)"
	$(BIN)/wmrl bench replay --json
	$(BIN)/wmrl bench sim --json
	$(BIN)/wmrl bench dataset --json

clean:
	rm -rf $(VENV) runs
