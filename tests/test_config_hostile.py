"""Hostile and damaged configs and overrides become one ConfigError line: no traceback, no misread value."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from r1trade.config import Config, load_config
from r1trade.errors import ConfigError

ANCHORS = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'] + [
    f"&{name} [{', '.join([f'*{previous}'] * 9)}]"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
]
BOMB = "".join(f"{anchor[1]}: {anchor}\n" for anchor in ANCHORS) + "name: *i\n"
"""About 400 bytes that expand to 9**9 strings: an alias bomb (its value quoted in full took minutes)."""
BOMB_FLOW = f"[{', '.join(ANCHORS)}, *i]"
"""The same bomb as one `--set` value."""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`r1trade ARGS` in a fresh interpreter; the timeout stands for 'finishes fast'."""
    command = [sys.executable, "-m", "r1trade.cli", *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=30, cwd=cwd)


def fields_of(kind: type, model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, bool]]:
    """Dotted paths of every field in the config tree that holds a `kind` (alone, optional, or in a tuple or a
    list), and whether it is such a sequence."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from fields_of(kind, annotation, f"{prefix}{name}.")
        elif annotation is kind or kind in typing.get_args(annotation):
            yield prefix + name, typing.get_origin(annotation) in (tuple, list)


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        pytest.param(BOMB, [], "aliases expand to more than", id="alias-bomb-file"),
        pytest.param(None, ["--set", f"name={BOMB_FLOW}"], "aliases expand", id="alias-bomb-set"),
        pytest.param("env:\n  fee_bps: 5\n".encode("utf-16"), [], "not UTF-8 text", id="utf-16"),
        pytest.param("[" * 2000 + "]" * 2000, [], "nested deeper than", id="deep-nesting"),
        pytest.param(None, ["--set", "env.fee_bps=.inf"], "finite number", id="infinite-fee"),
        pytest.param(None, ["--set", "name=../x"], "plain file name", id="name-climbs-out"),
        pytest.param(
            "data:\n  split:\n    method: dates\n"
            "    train_end: 2024-03-01T00:00:00Z\n    validation_end: 2024-02-01\n",
            [], "validation_end must not be before train_end", id="naive-and-aware-dates",
        ),
    ],
)
def test_cli_reports_one_line_and_exit_2(
    tmp_path: Path, content: str | bytes | None, args: list[str], expected: str
):
    if content is not None:
        path = tmp_path / "hostile.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        args = ["--config", str(path), *args]
    result = run_cli("show-config", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400, lines[:3]
    assert expected in lines[0] and ("hostile.yaml" in lines[0] or "--set" in lines[0])


def test_every_float_field_rejects_inf_and_nan():
    fields = dict(fields_of(float))
    assert {"env.fee_bps", "env.initial_cash", "train.learning_rate", "rewards.pnl"} <= set(fields)
    for dotted, sequence in fields.items():
        for value in (".inf", "-.inf", ".nan", '"inf"'):
            with pytest.raises(ConfigError, match="finite number"):
                load_config(None, [f"{dotted}={f'[{value}, {value}]' if sequence else value}"])


@pytest.mark.parametrize("params", ["{random: {x: .nan}}", "{sma_crossover: {fast: [1, {slow: -.inf}]}}"])
def test_free_form_backtest_params_reject_non_finite_numbers(params: str):
    with pytest.raises(ConfigError, match=r"backtest\.params: .*finite"):
        load_config(None, [f"backtest.params={params}"])


BAD_NAMES = ["/tmp/x", "../x", "a/b", "..", ".", "", ".hidden", "-rf", "a\\b", "é", "x" * 101]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_run_name_must_be_a_plain_file_name(name: str):
    with pytest.raises(ConfigError, match="name: .*plain file name"):
        load_config(None, [f"name='{name}'"])
    for good in ("demo-btc", "btc_ws48_t12", "ppo.v2", "x" * 100):
        assert load_config(None, [f"name={good}"]).name == good


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"name: caf\xe9\n", "not UTF-8 text", id="latin-1"),
        pytest.param(b"# padding\n" * 110_000, "larger than 1,048,576 bytes", id="too-large"),
        pytest.param(b"name: &a [*a]\n", "alias inside its own anchor", id="self-alias"),
        pytest.param(
            b"env:\n  fee_bps: 5\nenv:\n  initial_cash: 500\n", "line 3, column 1: key 'env' repeated",
            id="repeated-section",
        ),
        pytest.param(b"seed: 010\n", "ambiguous number '010'", id="octal"),
        pytest.param(b"x" * 1000 + b": 1\n", "unknown key 'xxx", id="long-key"),
    ],
)
def test_damaged_files_name_the_file_and_the_problem(tmp_path: Path, content: bytes, expected: str):
    path = tmp_path / "damaged.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:") and expected in message and len(message) < 300


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("seed=010", "ambiguous number '010'"),
        ("train.updates=1:30", "ambiguous number '1:30'"),
        ("seed=-1", r"seed: Input should be greater than or equal to 0"),
        ("data.synthetic.seed=4294967296", r"data\.synthetic\.seed: Input should be less than"),
        ("data.synthetic.start=2300-01-01", r"data\.synthetic: .*within 1678-2262"),
        ("data.synthetic.timeframe=99999999999d", r"data\.synthetic: .*within 1678-2262"),
        ("name=" + "y" * 5000, r"\(got 'yyyy"),
        ("backtest.params.random." + "a." * 2000 + "b=1", "more than 50 levels"),
    ],
)
def test_overrides_that_would_be_misread_or_crash_later(override: str, expected: str):
    with pytest.raises(ConfigError, match=expected) as caught:
        load_config(None, [override])
    assert len(str(caught.value)) < 300


def test_naive_and_aware_split_dates_compare_as_utc():
    dates = ["data.split.method=dates", "data.split.train_end=2024-01-01T00:00:00Z"]
    assert load_config(None, [*dates, "data.split.validation_end=2024-02-01"]).data.split.method == "dates"
    with pytest.raises(ConfigError, match="validation_end must not be before train_end"):
        load_config(None, [*dates, "data.split.validation_end=2023-12-31T23:00:00"])


def test_merge_keys_and_unambiguous_numbers_still_load(tmp_path: Path):
    """Keys a merge (`<<`) brings in are no repeats; only leading zeros and base-60 numbers are refused."""
    path = tmp_path / "merge.yaml"
    path.write_text("train: &rate\n  learning_rate: 0.001\nwarmstart:\n  <<: *rate\n  learning_rate: 0.01\n")
    assert load_config(path).warmstart.learning_rate == 0.01
    cfg = load_config(None, ["seed=10", "env.fee_bps=0", "train.updates=0x10", "env.slippage_bps=0.5"])
    assert (cfg.seed, cfg.env.fee_bps, cfg.train.updates, cfg.env.slippage_bps) == (10, 0.0, 16, 0.5)
    with pytest.raises(ConfigError, match="ambiguous number '020'"):
        load_config(None, ["train.updates=020"])


def test_every_int_field_has_an_upper_bound():
    """A count a user sets (episodes, windows, resamples, block sizes, tokens...) is refused in one line when it is
    absurd, before numpy meets an integer it cannot hold or a run sizes its arrays by it."""
    fields = [dotted for dotted, _ in fields_of(int)]
    assert {"backtest.bootstrap_resamples", "rollout.max_new_tokens", "backtest.agent_windows"} <= set(fields)
    for dotted in fields:
        value = 10**30
        with pytest.raises(ConfigError, match=r"less than|at most") as caught:
            load_config(None, [f"{dotted}={value}"])
        assert len(str(caught.value)) < 400


@pytest.mark.parametrize("resamples", ["200000", "1000000000"])
def test_bootstrap_resamples_are_bounded_and_the_bound_explained(tmp_path: Path, resamples: str):
    """200,000 resamples took 5.4 GB, 10**9 ended in a MemoryError: the bound names its reason."""
    result = run_cli("show-config", "--set", f"backtest.bootstrap_resamples={resamples}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert "backtest.bootstrap_resamples: Value error, at most 10,000" in line
    assert "32 bytes per resample and decision" in line and f"(got {resamples})" in line
    assert load_config(None, ["backtest.bootstrap_resamples=10000"]).backtest.bootstrap_resamples == 10_000
