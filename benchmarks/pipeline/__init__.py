"""Backtest throughput on Spark vs a plain loop vs the data path (python -m benchmarks.pipeline)."""
