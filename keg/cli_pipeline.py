"""`keg capture`, `keg backtest`, `keg analyze`: the data pipeline's commands.

Registered on keg's app by keg/cli.py (`commands`).
Exit codes: 0 done, 1 a `--fail-on` threshold was crossed, 2 the job could not run
(bad input, invalid rules, no Java...): one clear line each, never a stack trace.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from keg.console import error_line, make_console, plain_column, styled

#: This module's commands; keg/cli.py adds them to keg's app.
commands = typer.Typer()

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

console = make_console()
out_console = make_console(stderr=False)

Master = Annotated[str, typer.Option(
    help="Spark master: local[*] (this machine), local[N], spark://host:port, yarn, k8s://...")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
SparkConfs = Annotated[list[str] | None, typer.Option(
    "--conf", metavar="KEY=VALUE",
    help="A Spark property, as spark-submit --conf (repeat), e.g. "
         "spark.executor.memory=4g.")]


@contextlib.contextmanager
def _job() -> Iterator[None]:
    """PipelineError -> one red line and exit 2."""
    from pipeline.errors import PipelineError

    try:
        yield
    except PipelineError as err:
        for line in str(err).splitlines():
            console.print(error_line(line))
        raise typer.Exit(2) from None


@contextlib.contextmanager
def _interrupted(message: str) -> Iterator[None]:
    """Ctrl-C -> `message` and exit 130 (as a shell reports SIGINT), not a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        console.print(error_line(message))
        raise typer.Exit(130) from None


def _session(master: str, confs: list[str] | None, kafka: bool = False) -> SparkSession:
    from pipeline.errors import PipelineError
    from pipeline.spark import build_session

    conf = {}
    for item in confs or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"--conf {item!r}: expected KEY=VALUE, e.g. "
                                f"spark.executor.memory=4g")
        conf[key.strip()] = value
    with console.status(Text(f"starting Spark ({master})")):
        return build_session(master, kafka=kafka, conf=conf)


def _parse_time(value: str | None, option: str) -> int | None:
    """Milliseconds since the epoch, or an ISO 8601 date/time (UTC unless it says)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"'{value}' is neither ms since the epoch nor ISO 8601",
                                 param_hint=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@commands.command("capture")
def capture_cmd(
    topic: Annotated[str, typer.Option(help="Topic to snapshot.")],
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka (or the gateway): host:port.")]
        = "127.0.0.1:19092",
    out: Annotated[Path, typer.Option(help="Capture directory (date=/topic= partitions).")]
        = Path("keg-capture"),
    partition: Annotated[list[int] | None, typer.Option(
        help="Only these partitions (repeat the option); default: all.")] = None,
    from_offset: Annotated[int | None, typer.Option(help="First offset (default: earliest).")]
        = None,
    to_offset: Annotated[int | None, typer.Option(
        help="Stop before this offset (default: the end when the snapshot starts).")] = None,
    from_time: Annotated[str | None, typer.Option(
        help="Start at the first record at or after this time (ms or ISO 8601).")] = None,
    to_time: Annotated[str | None, typer.Option(
        help="Stop at the first record at or after this time (ms or ISO 8601).")] = None,
    direction: Annotated[str, typer.Option(
        help="produce: backtest as if produced again; consume: as fetched.")] = "produce",
    values: Annotated[bool, typer.Option(help="Keep record values (--no-values: keys, "
                                              "headers and sizes only).")] = True,
    max_bytes: Annotated[int, typer.Option(help="Stop when the directory holds this much.")]
        = 1 << 30,
    rotate_bytes: Annotated[int, typer.Option(help="Start a new file after this size.")]
        = 64 << 20,
    quiet: Quiet = False,
) -> None:
    """Snapshot a topic range from Kafka into capture files (Parquet) for `keg backtest`."""
    from pipeline.snapshot import snapshot

    if direction not in ("produce", "consume"):
        raise typer.BadParameter("produce or consume", param_hint="--direction")
    if from_offset is not None and from_time is not None:
        raise typer.BadParameter("give --from-offset or --from-time, not both")
    if to_offset is not None and to_time is not None:
        raise typer.BadParameter("give --to-offset or --to-time, not both")
    start_ms, end_ms = _parse_time(from_time, "--from-time"), _parse_time(to_time, "--to-time")
    # An empty range is a mistake, not a capture of nothing (it exited 0 with 0 records).
    if from_offset is not None and to_offset is not None and to_offset <= from_offset:
        raise typer.BadParameter(f"--to-offset {to_offset} is not after --from-offset "
                                 f"{from_offset} (the capture stops before it)",
                                 param_hint="--to-offset")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise typer.BadParameter(f"--to-time {to_time} is before --from-time {from_time}",
                                 param_hint="--to-time")
    progress = Progress(plain_column("bold"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("offsets"), TimeElapsedColumn(), console=console,
                        disable=quiet)
    task = progress.add_task(f"capture {topic}", total=None)
    with _job(), progress, _interrupted(f"capture interrupted: nothing of it was kept in {out}"):
        result = snapshot(
            bootstrap_servers, topic, out, partitions=partition, from_offset=from_offset,
            to_offset=to_offset, from_time_ms=start_ms, to_time_ms=end_ms,
            direction=direction,  # type: ignore[arg-type]
            include_values=values, max_bytes=max_bytes, rotate_bytes=rotate_bytes,
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    ranges = ", ".join(f"{r.partition}:{r.start}..{r.end}" for r in result.ranges)
    typer.echo(f"{result.records} records from {topic} [{ranges}] -> {out} "
               f"({len(result.files)} file(s))" + (" — stopped at --max-bytes" if result.full
                                                   else ""))


@commands.command("backtest")
def backtest_cmd(
    rules: Annotated[Path, typer.Option(help="Candidate rule directory (YAML).")],
    input_: Annotated[str, typer.Option(
        "--input", help="Capture directory/file, or kafka://host:port/topic.")],
    live_rules: Annotated[Path | None, typer.Option(
        help="The rules live now: the report shows records whose outcome differs.")] = None,
    out: Annotated[Path, typer.Option(help="Result directory.")] = Path("keg-backtest"),
    fail_on: Annotated[list[str] | None, typer.Option(
        help="Exit 1 when crossed: 'dropped>0.1', 'rejected>=1', 'differs>5%', "
             "'RULE:modified==0' (repeat the option).")] = None,
    master: Master = "local[*]",
    conf: SparkConfs = None,
    method: Annotated[str | None, typer.Option(
        help="direct (tasks read and write Parquet with pyarrow; the default for a "
             "capture), arrow (mapInArrow; the default and only route for kafka://) or "
             "pandas (mapInPandas).")] = None,
    quiet: Quiet = False,
) -> None:
    """Run a candidate rule set over captured records with the gateway's own engine."""
    from filter_rules import load_rule_dir
    from pipeline.backtest import METHODS, load_rules, run_backtest
    from pipeline.inputs import KafkaInput, check_capture_files, parse_input, read_records
    from pipeline.progress import spark_progress
    from pipeline.reports import backtest_report
    from pipeline.snapshot import check_topic
    from pipeline.thresholds import check, check_rule_ids, parse_threshold

    if method not in (None, *METHODS):
        raise typer.BadParameter(", ".join(METHODS), param_hint="--method")
    with _job():
        thresholds = [parse_threshold(t) for t in fail_on or []]
        candidate = load_rules(rules)
        check_rule_ids(thresholds, {rule.id for rule in load_rule_dir(rules).rules},
                       {u.rule_id: u.kind for u in candidate.unjudged if not u.approximate})
        live = load_rules(live_rules) if live_rules is not None else None
        for unjudged in (*candidate.unjudged, *(live.unjudged if live else ())):
            console.print(styled(("warning:", "yellow"), f" {unjudged.line()}"))
        source = parse_input(input_)
        if isinstance(source, Path):
            check_capture_files(source)
        kafka = isinstance(source, KafkaInput)
        if kafka and method == "direct":
            raise typer.BadParameter("the direct route reads capture files; kafka:// input "
                                     "goes through arrow or pandas", param_hint="--method")
        if isinstance(source, KafkaInput):
            check_topic(source.bootstrap, source.topic)
        spark = _session(master, conf, kafka=kafka)
        records = source if isinstance(source, Path) else read_records(spark, source)
        with spark_progress(spark, "backtest", console, enabled=not quiet):
            result = run_backtest(spark, records, candidate, live, out,
                                  method)  # type: ignore[arg-type]
        crossed = check(thresholds, result.summary)
        report = backtest_report(result.summary, crossed, out / "report.html")
    _print_backtest(result.summary, result.seconds)
    typer.echo(f"results: {out}/records (Parquet), {out}/summary.json; report: {report}")
    for line in crossed:
        console.print(styled(("threshold crossed:", "red"), f" {line}"))
    if crossed:
        raise typer.Exit(1)


def _print_backtest(summary: dict[str, Any], seconds: float) -> None:
    totals = summary["totals"]
    table = Table(title=f"backtest: {totals['records']:,} records in {seconds:.1f} s")
    counts = ["matched", "modified", "dropped", "rejected", "failed"]
    # What dry-run rules would have done, when one would have done anything (as the
    # report shows them): without it a dry-run rule read as one that did nothing.
    dry = [c for c in ("would_modified", "would_dropped", "would_rejected")
           if any(r[c] for r in summary["rules"])]
    for column in ("rule", "kind", *counts, *(c.replace("_", " ") for c in dry)):
        table.add_column(column, justify="left" if column in ("rule", "kind") else "right")
    for r in summary["rules"]:
        table.add_row(r["rule_id"], r["kind"], *(f"{r[c]:,}" for c in (*counts, *dry)))
    table.add_row(Text("all records", style="bold"), "", f"{totals['records']:,}",
                  *(f"{totals[c]:,}" for c in counts[1:]), *("" for _ in dry))
    out_console.print(table)
    differs = f"{totals['differs']:,}" if summary.get("live_rules_dir") else "n/a (no --live-rules)"
    out_console.print(f"differ from the live rules: {differs}; bytes "
                      f"{totals['bytes_before']:,} -> {totals['bytes_after']:,}")
    if summary.get("unjudged"):
        out_console.print(f"not judged as live: {len(summary['unjudged'])} rule(s), see the "
                          "warnings above and the report")


@commands.command("analyze")
def analyze_cmd(
    audit: Annotated[str, typer.Option(
        help="Audit log (JSON Lines) or a directory of them; with --follow the audit "
             "topic, kafka://host:port/topic.")],
    out: Annotated[Path, typer.Option(help="Result directory.")] = Path("keg-analyze"),
    follow: Annotated[bool, typer.Option(
        help="Follow the audit topic (Spark Structured Streaming): per-minute impact per "
             "rule, topic, principal and outcome in OUT (Parquet, served as /v1/impact "
             "by a control plane whose --impact-dir is OUT), OUT/report.html; until "
             "Ctrl-C.")] = False,
    kafka_config: Annotated[list[str] | None, typer.Option(
        help="A Kafka consumer property for --follow, key=value (repeat), e.g. "
             "security.protocol=SASL_SSL.")] = None,
    from_: Annotated[str, typer.Option(
        "--from", help="--follow without a checkpoint in OUT starts at the topic's "
                       "earliest or latest events.")] = "earliest",
    late_after: Annotated[str, typer.Option(
        help="--follow: events older than this behind the newest are not counted "
             "(the event-time watermark).")] = "10 minutes",
    trigger: Annotated[str, typer.Option(help="--follow: one micro-batch this often.")]
        = "2 seconds",
    master: Master = "local[*]",
    conf: SparkConfs = None,
    quiet: Quiet = False,
) -> None:
    """Aggregate the gateway's audit log: who did what, what was denied, how fast; or,
    with --follow, the live impact of each rule from the audit topic."""
    if follow:
        _follow(audit, out, kafka_config, from_, late_after, trigger, master, conf, quiet)
        return
    from pipeline.analyze import audit_files, run_analyze
    from pipeline.errors import PipelineError
    from pipeline.progress import spark_progress
    from pipeline.reports import analyze_report

    with _job():
        if "://" in audit:  # (as a path, kafka://h:p/t read "kafka:/h:p/t does not exist")
            raise PipelineError(f"--audit {audit}: the audit topic is read with --follow; "
                                "without it --audit is a file or directory of audit logs")
        audit_files(Path(audit))  # bad paths fail before Spark starts
        spark = _session(master, conf)
        with spark_progress(spark, "analyze", console, enabled=not quiet):
            result = run_analyze(spark, Path(audit), out)
        report = analyze_report(result.summary, out / "report.html")
    totals = result.summary["totals"]
    typer.echo(json.dumps({k: totals[k] for k in ("events", "bytes", "denied", "rejected",
                                                  "malformed")}))
    typer.echo(f"results: {out}/*.parquet, {out}/summary.json; report: {report}")


def _follow(audit: str, out: Path, kafka_config: list[str] | None, starting: str,
            late_after: str, trigger: str, master: str, conf: list[str] | None,
            quiet: bool) -> None:
    from pipeline.errors import PipelineError
    from pipeline.impact import follow
    from pipeline.inputs import KafkaInput, parse_input
    from pipeline.snapshot import check_topic

    with _job():
        source = parse_input(audit)
        if not isinstance(source, KafkaInput):
            raise PipelineError("--follow reads the audit topic: --audit "
                                "kafka://host:port/topic")
        options = {}
        for item in kafka_config or ():
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise PipelineError(f"--kafka-config {item!r}: expected key=value")
            options[key] = value
        if not options:  # (security properties are the JVM's, not librdkafka's)
            check_topic(source.bootstrap, source.topic)
        spark = _session(master, conf, kafka=True)

        def batch_done(batch_id: int, rows: int) -> None:
            if not quiet and rows:
                console.print(f"batch {batch_id}: {rows} minute row(s) updated", style="dim")

        query, _ = follow(spark, source, out, kafka_options=options, starting=starting,
                          late_after=late_after, trigger=trigger, on_batch=batch_done)
        typer.echo(f"following {audit}: impact in {out} (Parquet), report "
                   f"{out}/report.html; Ctrl-C stops")
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
            return
        failure = query.exception()
        if failure is not None:
            from pipeline.spark import first_line

            raise PipelineError(f"following the audit topic failed: {first_line(failure)}")
