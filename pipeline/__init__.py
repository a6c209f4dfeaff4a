"""The data pipeline on Spark: capture, backtest, audit analytics (issue 7)."""
