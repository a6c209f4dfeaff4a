"""A short, bounded fuzz run for CI (the long runs: `python -m tests.fuzz.fuzz_frames`)."""

from __future__ import annotations

import os

import pytest

import kafka_wire as kw
from tests.fuzz import fuzz_frames
from tests.fuzz.fuzz_frames import Outcome, build_corpus, fuzz, target

RUNS = int(os.environ.get("KEG_FUZZ_RUNS", "20000"))
SEED = int(os.environ.get("KEG_FUZZ_SEED", "559"))


def test_bounded_fuzz_run_raises_only_kafka_wire_errors() -> None:
    report = fuzz(RUNS, seed=SEED)
    assert report.runs == RUNS
    failures = "\n".join(f"input {data}\n{tb}" for data, tb in report.failures[:3])
    assert not report.failures, f"seed {SEED}: {len(report.failures)} failures\n{failures}"
    o = report.outcome
    # The mutations reach every layer: frames decode and get rejected, group payloads
    # and envelopes are opened.
    assert o.frames_ok and o.frames_rejected and o.streams_cut
    assert o.group_payloads and o.envelopes and o.payloads_ok and o.payloads_rejected


def test_every_seed_input_is_accepted_whole() -> None:
    out = Outcome()
    corpus = build_corpus(SEED, limit=40)
    for data in corpus:
        target(data, out)
    assert out.frames_rejected == 0 and out.streams_cut == 0
    assert out.frames_ok >= 2 * 40


def test_the_harness_reports_foreign_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(frame: object) -> None:
        raise TypeError("a bug in the codec")

    monkeypatch.setattr(kw, "decode_request", broken)
    report = fuzz(200, seed=1, corpus_limit=10)
    assert report.failures and "a bug in the codec" in report.failures[0][1]
    assert fuzz_frames.main(["--reproduce", os.devnull]) == 0
