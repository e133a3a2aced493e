# Two entry points, each doing its own set-up in .venv/ (created or reused, installing only what is missing):
#   make demo   the embedded default experiment, ending in results/tables.md
#   make test   the test suite (what CI runs)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# `snakemake --cores 0` waits forever for a free core (and pytest -n 0 runs no workers): refuse a
# CORES below 1 before anything is installed or started.
ifneq ($(filter demo test,$(MAKECMDGOALS)),)
ifeq ($(shell [[ "$(CORES)" =~ ^[1-9][0-9]*$$ ]] && echo ok),)
$(error CORES=$(CORES): give a whole number >= 1 (demo: snakemake cores, test: pytest workers))
endif
endif

.PHONY: demo test venv lint clean-results

# The stamp records the requirements it installed; editing requirements.txt reinstalls what changed.
$(VENV)/.installed: requirements.txt requirements-nodeps.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	cp requirements.txt $@

# `python -m pyserini...` and `import pyserini` apply the Java fixes by themselves in this venv.
$(VENV)/.pyserini-hook: $(VENV)/.installed workflow/retrieval_pretraining/pyserini_setup.py
	PYTHONPATH=workflow $(PY) -m retrieval_pretraining.pyserini_setup --install-hook
	touch $@

venv: $(VENV)/.installed $(VENV)/.pyserini-hook

# profiles/local: one thread per encoder job, so that the many short ones run side by side.
demo: venv
	$(VENV)/bin/snakemake --cores $(CORES) --workflow-profile profiles/local --rerun-incomplete all

# One pytest worker per core (pytest-xdist); a test file stays on one worker, so the expensive
# module fixtures (the end-to-end run, the Slurm cluster) are built once. --no-loadscope-reorder
# keeps tests/conftest.py's order (longest files first); xdist's default re-sorts files by their
# number of tests, which started the Slurm file 40th of 52 and the corpus reruns last. --durations:
# the slowest tests and fixtures end every log (CI's included), where a regression shows first.
test: venv
	$(PY) -m pytest -q -n $(CORES) --dist loadfile --no-loadscope-reorder --durations=25

lint: venv
	$(VENV)/bin/snakefmt --check Snakefile rules/
	$(VENV)/bin/snakemake --lint

clean-results:
	rm -rf results/ .snakemake/
