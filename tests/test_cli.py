"""The command line as a user meets it: exit codes and one-line errors."""

import re
from pathlib import Path

import pytest
from conftest import run_in_a_fresh_process

from r1trade import __version__
from r1trade.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_and_help(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"r1trade {__version__}"
    code, out, _ = run(capsys, "--help")
    for command in ("fetch-data", "data-info", "show-config", "train", "backtest"):
        assert command in out


def test_show_config_prints_resolved_yaml(capsys):
    code, out, _ = run(capsys, "show-config", "--config", "smoke", "--set", "env.fee_bps=3")
    assert code == 0
    assert "name: smoke" in out and "fee_bps: 3.0" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show-config", "--set", "env.fee_bsp=3"], "unknown key 'env.fee_bsp' (did you mean 'env.fee_bps'?)"),
        (["show-config", "--set", "env.fee_bps=abc"], "env.fee_bps: Input should be a valid number"),
        (["show-config", "--config", "missing.yaml"], "config not found: 'missing.yaml'"),
        (["train", "--config", "smoke", "--set", "bogus=1"], "unknown key 'bogus'"),
        (["data-info", "nowhere.parquet"], "candle file not found: 'nowhere.parquet'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(capsys, args, message):
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_data_info_on_the_sample(capsys, sample_path: Path):
    code, out, _ = run(capsys, "data-info", str(sample_path))
    assert code == 0
    assert "20,111" in out and "2017-07-01 11:00 → 2019-10-17 09:00 UTC" in out and "gaps" in out


def test_data_info_exits_1_on_bad_candles(capsys, candles, tmp_path: Path):
    from r1trade.data.store import save_candles

    bad = candles.copy()
    bad.iloc[2, 0] = -1.0
    path = save_candles(bad, tmp_path / "bad.parquet")
    code, out, _ = run(capsys, "data-info", str(path))
    assert code == 1 and "non-positive prices" in out


def test_data_info_range_is_earliest_to_latest_on_an_unordered_file(capsys, candles, tmp_path: Path):
    from r1trade.data.store import save_candles

    # rows 10:00, 12:00, ..., then the first hour last: the first and last rows are not the range
    shuffled = candles.iloc[:6].iloc[[2, 4, 1, 5, 3, 0]]
    path = save_candles(shuffled, tmp_path / "unordered.csv")
    code, out, _ = run(capsys, "data-info", str(path))
    assert code == 1 and "non-monotonic timestamps" in out
    assert "2021-01-01 00:00 → 2021-01-01 05:00 UTC" in out


def test_import_csv_converts_cryptodatadownload(capsys, tmp_path: Path):
    csv = tmp_path / "cdd.csv"
    csv.write_text(
        "banner line\ndate,symbol,open,high,low,close,volume_btc,volume\n"
        "2019-10-17 12-PM,BTCUSD,2,3,1,3,6,18\n2019-10-17 11-AM,BTCUSD,1,2,0.5,2,5,10\n"
    )
    out_path = tmp_path / "out.parquet"
    code, out, _ = run(capsys, "import-csv", str(csv), "--out", str(out_path))
    assert code == 0 and out_path.is_file() and "BTC/USD" in out


def test_debug_shows_the_traceback():
    from r1trade.errors import UsageError

    with pytest.raises(UsageError):
        main(["--debug", "data-info", "nowhere.parquet"])


def test_fetch_data_through_the_cli_with_a_fake_exchange(capsys, tmp_path: Path, monkeypatch):
    from test_data_fetch import FakeExchange, synthetic_rows

    fake = FakeExchange(synthetic_rows(30, missing={7}), cap=8)
    monkeypatch.setattr("r1trade.data.fetch.make_exchange", lambda exchange_id, **_: fake)
    args = ["fetch-data", "--exchange", "fakex", "--symbol", "BTC/USDT", "--timeframe", "1h",
            "--since", "2024-01-01", "--until", "2024-01-02", "--out", str(tmp_path / "a[/b]")]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "gaps" in out and "1 (largest 1 bars" in out
    stored = list((tmp_path / "a[" / "b]").glob("*.parquet"))
    assert len(stored) == 1
    assert "".join(f"new to {stored[0]}".split()) in "".join(out.split())  # a name that reads as Rich markup
    code, out, _ = run(capsys, *args)  # resumable: nothing new to add
    assert code == 0 and "added 0 new" in out


def test_unreachable_exchange_is_one_line_exit_1(capsys, monkeypatch):
    import ccxt

    def broken(exchange_id, **_):
        from test_data_fetch import FakeExchange

        fake = FakeExchange([], cap=5)
        fake.load_markets = lambda *a, **k: (_ for _ in ()).throw(ccxt.NetworkError("binance GET https://x"))
        return fake

    monkeypatch.setattr("r1trade.data.fetch.make_exchange", broken)
    code, _, err = run(capsys, "fetch-data", "--exchange", "binance", "--max-retries", "0")
    assert code == 1 and "cannot reach" in err and len(err.strip().splitlines()) == 1


def test_every_bracket_of_a_command_s_help_is_printed(capsys):
    """Help is rendered as Rich markup, where `[word]` is a style tag and vanishes: units such as `[%]` must
    survive, and no help text may hold a bracket that Rich would eat."""
    from typer.main import get_command

    from r1trade.cli.app import app

    commands = get_command(app).commands
    assert len(commands) > 20
    for name, command in commands.items():
        code, out, _ = run(capsys, name, "--help")
        printed = re.sub(r"[\s│]", "", out)
        for text in [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]:
            for bracket in re.findall(r"\[[^\]\n]*\]", text):
                assert code == 0 and re.sub(r"\s", "", bracket) in printed, (name, bracket)


def test_each_paragraph_of_a_command_s_help_wraps_at_the_terminal(capsys, monkeypatch):
    """The docstring's line breaks are not kept: at 80 columns `paper --help` wraps its second paragraph evenly."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "paper", "--help")
    assert code == 0
    lines = [line.strip() for line in out.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("No real order is ever sent"))
    paragraph = lines[start: lines.index("", start)]
    assert len(paragraph) == 3 and all(len(line) > 60 for line in paragraph[:-1]), paragraph


def test_bad_input_is_refused_before_torch_is_imported(tmp_path: Path):
    """Refusing a bad option takes a second, not the seconds torch, transformers and peft take to import."""
    refused = [
        ["train", "--resume", str(tmp_path)],
        ["train", "--config", "smoke", "--set", "bogus=1"],
        ["warmstart", "--config", "smoke", "--set", "bogus=1"],
        ["select-step", str(tmp_path)],
        ["seeds", "--config", "smoke", "--seeds", "x", "--out", str(tmp_path / "seeds")],
        ["backtest", "--checkpoint", str(tmp_path / "nowhere")],
    ]
    codes, imported, err = run_in_a_fresh_process(refused)
    assert codes == [2] * len(refused) and imported == [], err
    assert len(err.splitlines()) == len(refused)  # one line each
