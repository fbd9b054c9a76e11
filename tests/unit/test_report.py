"""The report's numbers (pure) and its page on run directories with known timings."""

import math

import pytest
from support.report_runs import make_run, make_sweep

from opdflow.analysis.bottleneck import bottleneck, busy_shares, run_shares
from opdflow.analysis.curves import heldout_curve, run_accuracy_curve, version_times
from opdflow.analysis.report import write_report
from opdflow.analysis.runs import Run, expand_run_dirs
from opdflow.analysis.throughput import is_sweep, sweep_rows
from opdflow.errors import ConfigError
from opdflow.record.profiler import union_seconds


def test_bottleneck_rule():
    gen = bottleneck(0.33, 0.95, k=1)
    assert (
        gen.startswith("generation-bound: the trainer waits 33.0%") and "raise k (now k=1)" in gen
    )
    tr = bottleneck(0.01, 0.62)
    assert tr == (
        "trainer-bound: generation idle 38.0%; more rollout workers will not help "
        "(a faster learner will)"
    )
    assert bottleneck(0.05, 0.9).startswith("balanced")
    # waiting dominates: even idle generators do not make it trainer-bound
    assert bottleneck(0.5, 0.2).startswith("generation-bound")
    assert bottleneck(float("nan"), 0.5).startswith("unknown")
    # the bounds are parameters
    assert bottleneck(0.05, 0.9, wait_bound=0.04).startswith("generation-bound")


def test_union_and_busy_shares():
    assert union_seconds([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert union_seconds([]) == 0.0
    spans = [
        {"stage": "generator", "actor": "g0", "start_s": 0.0, "end_s": 5.0},
        {"stage": "generator", "actor": "g1", "start_s": 0.0, "end_s": 10.0},
        {"stage": "learner", "actor": "l", "start_s": 2.0, "end_s": 4.0},
        {"stage": "learner", "actor": "l", "start_s": 3.0, "end_s": 6.0},
    ]
    shares = busy_shares(spans)
    assert shares["generator"] == pytest.approx(0.75)  # mean of 0.5 and 1.0 over the 10 s window
    assert shares["learner"] == pytest.approx(0.4)


def test_heldout_curve_pools_tokens_and_times_versions():
    rows = [
        {"version": 4, "kl_sum": 3.0, "tokens": 2},
        {"version": 0, "kl_sum": 1.0, "tokens": 1},
        {"version": 4, "kl_sum": 1.0, "tokens": 2},
    ]
    assert heldout_curve(rows) == [(0, 1.0), (4, 1.0)]
    assert version_times([{"step": 0, "time_s": 1.5}, {"step": 1, "time_s": 2.5}]) == {
        0: 0.0,
        1: 1.5,
        2: 2.5,
    }


def test_shares_from_spans_and_from_metrics(tmp_path):
    # generator 0.3 s, learner 0.2 s per step, overlapped (k=2): step 0.3 s, wait 0.1 s
    with_spans = Run(make_run(tmp_path / "a", k=2))
    sh = run_shares(with_spans)
    assert sh.source == "spans" and sh.trainer_wait == pytest.approx(1 / 3)
    without = Run(make_run(tmp_path / "b", k=2, spans=False))
    sh2 = run_shares(without)
    assert sh2.source.startswith("metrics") and sh2.generator_busy == pytest.approx(1.0)
    assert bottleneck(sh2.trainer_wait, sh2.generator_busy).startswith("generation-bound")
    # learner slower than generation: trainer-bound
    slow = Run(make_run(tmp_path / "c", k=2, gen_s=0.1, train_s=0.4, spans=False))
    sh3 = run_shares(slow)
    assert sh3.trainer_wait == pytest.approx(0.0)
    assert bottleneck(sh3.trainer_wait, sh3.generator_busy).startswith(
        "trainer-bound: generation idle 75.0%"
    )


def test_sweep_rows_and_detection(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", ks=(0, 2, 4))
    runs = [Run(p) for p in expand_run_dirs([sweep])]
    assert [r.k for r in runs] == [0, 2, 4] and is_sweep(runs)
    assert not is_sweep(runs[:1])
    rows = sweep_rows(runs)
    assert [r["k"] for r in rows] == [0, 2, 4]
    assert [r["run"] for r in rows] == ["k=0", "k=2", "k=4"]
    assert rows[0]["ratio_to_k0"] == pytest.approx(1.0)
    assert rows[1]["ratio_to_k0"] == pytest.approx(0.5 / 0.3)
    assert all(math.isfinite(r["heldout_kl_end"]) for r in rows)


def test_page_sections(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", ks=(0, 2))
    page = write_report([sweep], tmp_path / "out").read_text()
    for text in (
        "Held-out KL",
        "Held-out accuracy",
        "Mismatch",
        "Trainer wait",
        "Stage timeline",
        "Sweep over staleness k",
    ):
        assert text in page
    assert "k0: no spans recorded" in page  # the first run has no spans.parquet
    assert "generation-bound" in page
    assert "<h2>Admission</h2>" in page and "noise(0.5)" in page and "reject" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched when viewed
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert pngs == [
        "heldout_accuracy_vs_step.png",
        "heldout_kl_vs_step.png",
        "heldout_kl_vs_time.png",
        "mismatch.png",
        "sweep.png",
        "timeline_k2.png",
        "trainer_wait.png",
    ]
    assert page.count('<img class="plot"') == len(pngs)


def test_single_run_without_spans_or_admission(tmp_path):
    run = make_run(tmp_path, k=1, spans=False)
    page = write_report([run]).read_text()
    assert (run / "report" / "report.html").is_file()
    assert "no spans recorded" in page
    assert "Sweep" not in page and "Admission" not in page


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="neither a run directory"):
        write_report([tmp_path])


def test_accuracy_curve_plot_and_table_only_when_the_task_has_answers(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    run = make_run(tmp_path, k=1, spans=False)
    curve = run_accuracy_curve(Run(run))
    assert [v for v, _ in curve] == [0, 4, 8, 12]
    assert curve[0][1] == pytest.approx(0.25) and curve[-1][1] == pytest.approx(0.85)
    page = write_report([run], tmp_path / "with").read_text()
    assert "<h2>Held-out accuracy</h2>" in page and "held-out accuracy end" in page
    assert (tmp_path / "with" / "heldout_accuracy_vs_step.png").is_file()
    # the same run on held-out prompts without reference answers: no accuracy anywhere
    prompts = tmp_path / "no_answers.parquet"
    pq.write_table(pa.table({"prompt": ["Q:1+2="]}), prompts)
    cfg = json.loads((run / "config.json").read_text())
    cfg["data"]["heldout"] = str(prompts)
    (run / "config.json").write_text(json.dumps(cfg))
    assert run_accuracy_curve(Run(run)) == []
    page = write_report([run], tmp_path / "without").read_text()
    assert "held-out accuracy" not in page.lower()
    assert not (tmp_path / "without" / "heldout_accuracy_vs_step.png").exists()
