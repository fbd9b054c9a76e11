"""A user pipeline on DAPO-Math-17k's schema with data.grader = "math", whose generator is
killed twice mid-run: held-out accuracy agrees with an independent grading of the very
responses the run saved, and both restarts are on the record (events, metrics, summary).

One run serves both checks (a run costs ~30 s on two cores). The prompts are the tiny
task's, written as DAPO rows (chat-message prompts, reward_model.ground_truth); most
held-out ground truths are written in an equivalent form (168.0, \\frac{336}{2}, 1.68e2)
that only a math grader accepts, so the exact rule would score those rows 0.
"""

from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

STEPS = 8  # warm-up 2, kills after 1 and 3: steps 6 and 7 are the run's clean steps
KILL_AFTER = (1, 3)  # rows whose on_step kills generator[0]; its restart hits the next step


def _equivalent(answer: str, i: int) -> str:
    """The same number in one of four spellings (plain, decimal, fraction, scientific)."""
    a = int(answer)
    return [answer, f"{a}.0", f"\\frac{{{2 * a}}}{{2}}", f"{a / 100:g}e2"][i % 4]


def _dapo_parquet(src, dst, equivalent: bool) -> None:
    table = pq.read_table(src).to_pylist()
    pq.write_table(
        pa.table(
            {
                "data_source": ["math_dapo"] * len(table),
                "prompt": [[{"content": r["prompt"], "role": "user"}] for r in table],
                "ability": ["MATH"] * len(table),
                "reward_model": [
                    {
                        "ground_truth": _equivalent(r["answer"], i) if equivalent else r["answer"],
                        "style": "rule-lighteval/MATH_v2",
                    }
                    for i, r in enumerate(table)
                ],
                "extra_info": [{"index": str(i)} for i in range(len(table))],
            }
        ),
        dst,
    )


@pytest.fixture(scope="module")
def dapo_run(tmp_path_factory, ray_local, tiny):
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.driver.controller import run_pipeline
    from opdflow.record.rundir import RunDir

    d = tmp_path_factory.mktemp("dapo")
    _dapo_parquet(tiny.train, d / "train.parquet", equivalent=False)
    _dapo_parquet(tiny.heldout, d / "heldout.parquet", equivalent=True)
    cfg = apply_overrides(
        PipelineConfig(name="dapo-schema"),
        [
            f"data.train={d / 'train.parquet'}", f"data.heldout={d / 'heldout.parquet'}",
            "data.grader=math", "eval.save_responses=true", "eval.prompts=16",
            f"train.steps={STEPS}", f"eval.every={STEPS}", "staleness.k=0",
            "reliability.checkpoint_every=0", "reliability.max_restarts=4",
        ],
    )  # fmt: skip
    stages, killed = [], []

    def on_step(row):
        if row["step"] in KILL_AFTER:
            generator = stages[0].pool.workers[0]
            os.kill(ray.get(generator.pid.remote(), timeout=120), signal.SIGKILL)
            killed.append(row["step"])

    run = RunDir.create(cfg, d / "run")
    summary = run_pipeline(cfg, run, on_step=on_step, on_start=stages.append)
    assert killed == list(KILL_AFTER)
    return summary, run


def test_heldout_accuracy_agrees_with_an_independent_grading(dapo_run):
    from math_verify import parse, verify

    from opdflow.record.rundir import read_table
    from opdflow.testbed.task import is_correct

    summary, run = dapo_run
    heldout = read_table(run.path / "heldout.parquet")
    for version in (0, STEPS):
        rows = read_table(run.path / "heldout_responses" / f"version_{version:06d}.parquet")
        assert len(rows) == 16 * 4  # eval.prompts x eval.samples_per_prompt
        mine = [bool(verify(parse(f"${r['answer']}$"), parse(r["response"]))) for r in rows]
        assert mine == [bool(r["correct"]) for r in rows]  # the run's grade, response by response
        per_prompt = {}
        for r, ok in zip(rows, mine):
            per_prompt.setdefault(r["prompt_index"], []).append(ok)
        recorded = {r["prompt_index"]: r["accuracy"] for r in heldout if r["version"] == version}
        assert recorded == pytest.approx({i: sum(v) / len(v) for i, v in per_prompt.items()})
        key = "heldout_accuracy_start" if version == 0 else "heldout_accuracy_end"
        assert summary[key] == pytest.approx(sum(mine) / len(mine))
        # the exact rule rejects the equivalent spellings the math grader accepts
        exact = [is_correct(r["response"], r["answer"]) for r in rows]
        assert sum(mine) > sum(exact) and all(m or not e for m, e in zip(mine, exact))


def test_both_generator_restarts_are_in_events_metrics_and_summary(dapo_run):
    from rich.console import Console

    from opdflow.cluster.restarts import RESTART_FLAG_SHARE
    from opdflow.commands.console import print_summary
    from opdflow.record.rundir import read_table

    summary, run = dapo_run
    restarts = [e for e in run.events() if e["event"] == "restart"]
    assert [(e["stage"], e["actor"], e["ray_restarts"]) for e in restarts] == [
        ("generator", "generator[0]", 1),
        ("generator", "generator[0]", 2),
    ]
    # each is seen after the step it hit: the one running when the kill landed (or, if Ray
    # reported the death only after that step ended, the next)
    hit = [e["step"] for e in restarts]
    assert all(s + 1 <= h <= s + 2 for s, h in zip(KILL_AFTER, hit)), hit
    metrics = read_table(run.path / "metrics.parquet")
    assert {r["step"]: r["restarts"] for r in metrics if r["restarts"]} == dict.fromkeys(hit, 1)
    assert summary["restarts"] == {"generator": 2}
    # a restart (a new process importing torch and loading models, the step's work again)
    # takes far longer than a tiny step: the table flags the run as slowed by restarts
    assert summary["restart_slowdown"] >= RESTART_FLAG_SHARE
    console = Console(width=120, record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "generator 2: cost" in text and "RESTARTS SLOWED THIS RUN" in text
    assert [r["step"] for r in metrics] == list(range(STEPS))  # nothing lost to the kills
