"""Spans: recording in an actor object, conversion to the run clock, files, step columns."""

import json
import math

import pytest

from opdflow.record.profiler import (
    STAGES,
    Span,
    SpanRecorder,
    chrome_trace,
    step_columns,
    to_span,
    write_spans,
)
from opdflow.record.rundir import read_table


class Worker(SpanRecorder):
    def work(self, step: int) -> int:
        with self.span("generator", step, version=step - 1) as s:
            total = sum(range(10_000))
            s["tokens"] = 42
        return total


class _Ticking:
    """A clock that advances 0.25 s on every reading."""

    def __init__(self, start: float):
        self.t = start - 0.25

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def test_recorder_times_work_and_drains_once():
    w = Worker()
    w.wall_clock, w.duration_clock = _Ticking(1000.0), _Ticking(0.0)
    epoch0 = 1000.0
    w.work(3)
    w.work(4)
    raw = w.drain_spans()
    assert w.drain_spans() == []
    spans = [to_span(r, "generator[0]", epoch0) for r in raw]
    assert [s.step for s in spans] == [3, 4]
    assert [s.version for s in spans] == [2, 3]
    assert all(s.tokens == 42 and s.bytes == 0 for s in spans)
    assert all(0 <= s.start_s <= s.end_s < 5 for s in spans)
    assert spans[0].end_s <= spans[1].start_s + 1e-3


def test_a_span_is_recorded_even_when_the_work_raises():
    w = Worker()
    with pytest.raises(ZeroDivisionError), w.span("learner", 0, 0):
        _ = 1 / 0
    assert len(w.drain_spans()) == 1


def _spans() -> list[Span]:
    return [
        Span("generator", "generator[0]", 0, 0, 0.0, 1.0, 10, 0),
        Span("generator", "generator[1]", 0, 0, 0.0, 0.5, 10, 0),
        Span("fetch", "generator[0]", 1, 1, 2.0, 2.5, 0, 1000),
        Span("generator", "generator[0]", 1, 1, 2.5, 3.0, 10, 0),
        Span("learner", "learner", 0, 0, 1.0, 2.0, 20, 0),
        Span("publish", "learner", 0, 1, 2.0, 2.2, 0, 500),
        Span("learner", "learner", 1, 1, 3.0, 4.0, 20, 0),
    ]


def test_step_columns_busy_share_per_actor_kind_and_fetches():
    actors = ["generator[0]", "generator[1]", "rescorer", "teacher", "learner", "evaluator"]
    cols = step_columns(_spans(), 0.0, 4.0, actors)
    # generator[0] busy 1.0 + 0.5 (fetch) + 0.5 = 2.0 of 4; generator[1] 0.5 of 4
    assert cols["busy_share_generator"] == pytest.approx((2.0 / 4 + 0.5 / 4) / 2)
    # learner: train 1.0 + publish 0.2 + train 1.0
    assert cols["busy_share_learner"] == pytest.approx(2.2 / 4)
    assert cols["busy_share_rescorer"] == 0.0
    assert (cols["fetch_s"], cols["fetch_bytes"]) == (pytest.approx(0.5), 1000)
    # overlapping spans of one actor count once, clipped to the interval
    cols = step_columns(_spans(), 1.5, 2.1, actors)
    assert cols["busy_share_learner"] == pytest.approx(1.0)
    assert cols["fetch_s"] == pytest.approx(0.5)
    assert math.isnan(step_columns([], 0, 1, [])["busy_share_generator"])


def test_spans_parquet_and_trace_json_are_well_formed(tmp_path):
    spans = _spans()
    write_spans(tmp_path, spans)
    rows = read_table(tmp_path / "spans.parquet")
    assert len(rows) == len(spans)
    assert set(rows[0]) == {
        "stage",
        "actor",
        "step",
        "version",
        "start_s",
        "end_s",
        "tokens",
        "bytes",
    }
    assert all(r["stage"] in STAGES and r["end_s"] >= r["start_s"] for r in rows)
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(spans)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert set(names.values()) == {"generator[0]", "generator[1]", "learner"}
    for e in complete:
        assert e["tid"] in names and e["dur"] >= 0 and e["cat"] in STAGES
        assert {"step", "version", "tokens", "bytes"} <= set(e["args"])
    assert [e["ts"] for e in complete] == sorted(e["ts"] for e in complete)


def test_empty_run_writes_empty_files(tmp_path):
    write_spans(tmp_path, [])
    assert read_table(tmp_path / "spans.parquet") == []
    assert chrome_trace([])["traceEvents"][0]["ph"] == "M"
