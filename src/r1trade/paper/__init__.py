"""Paper (dry-run) trading: a trained checkpoint trades live or replayed candles with simulated fills only.

`feed` brings closed candles (an exchange through ccxt, or a candle file), `journal` records everything in
SQLite, `runner` takes the decisions, `view` shows the run, `report` turns a journal into a backtest report.
"""
