"""The data pipeline on Spark: capture, backtest, audit analytics.

    spark = build_session("local[2]")
    rules = load_rules(Path("candidate-rules"))          # file:line errors: RulesInvalid
    result = run_backtest(spark, read_records(spark, parse_input("capture/")), rules,
                          live=None, out=Path("out"))
    result.summary["totals"]["dropped"]

Every record goes through `interceptors.engine.RecordEngine.evaluate`, the data
path's own code (pipeline.evaluate); nothing of the rules is re-implemented here.
The CLI is keg/cli_pipeline.py; the design and measurements are in docs/pipeline.md.
"""

from pipeline.analyze import AnalyzeResult, run_analyze
from pipeline.backtest import BacktestResult, RulesInvalid, load_rules, run_backtest
from pipeline.errors import PipelineError
from pipeline.inputs import KafkaInput, parse_input, read_records
from pipeline.snapshot import SnapshotResult, snapshot
from pipeline.spark import build_session
from pipeline.thresholds import Threshold, check, parse_threshold

__all__ = [
    "AnalyzeResult",
    "BacktestResult",
    "KafkaInput",
    "PipelineError",
    "RulesInvalid",
    "SnapshotResult",
    "Threshold",
    "build_session",
    "check",
    "load_rules",
    "parse_input",
    "parse_threshold",
    "read_records",
    "run_analyze",
    "run_backtest",
    "snapshot",
]
