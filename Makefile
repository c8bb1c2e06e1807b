# Two commands do all the set-up: `make train` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0 lies on disk on the project's machines; elsewhere pip picks your build.
TORCH ?= torch==2.13.0
ENV ?= Hopper-v5
STEPS ?= 50000
SEED ?= 1
ARGS ?=
STAMP := $(VENV)/.keelrl-installed

.PHONY: train test install clean

install: $(STAMP)

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install -e ".[dev,envpool,llm,ray,offline]" || $(PY) -m pip install -e ".[dev,llm,ray,offline]" || $(PY) -m pip install -e ".[dev,llm,offline]"
	touch $(STAMP)

train: $(STAMP)
	$(PY) -m keelrl.agents.sac --env-id $(ENV) --total-timesteps $(STEPS) --seed $(SEED) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
