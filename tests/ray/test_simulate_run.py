"""`opdflow simulate` from a real short tiny run's directory: spans in, a table and plot out."""

import math

import pytest
from click.testing import CliRunner

from opdflow.analysis.simulator import SATURATED_WAIT_SHARE, SimConfig, simulate
from opdflow.analysis.stage_times import StageTimes
from opdflow.record.rundir import read_table


@pytest.fixture(scope="module")
def run_dir(k0_run):
    return k0_run[2].path


def test_stage_times_come_from_the_spans(run_dir):
    times = StageTimes.from_run(run_dir)
    assert times.prompts_per_step == 8 and times.responses_per_prompt == 8
    steps = len(read_table(run_dir / "metrics.parquet"))
    assert len(times.gen_chunk_s) == steps - times.warmup_steps
    for name in ("gen_chunk_s", "learner_s_per_token", "rescorer_s_per_token", "publish_s"):
        assert (getattr(times, name) > 0).all(), name
    assert 1 <= times.response_lengths.mean() <= times.max_new_tokens
    sync = simulate(times, SimConfig(k=0, steps=50))
    async_ = simulate(times, SimConfig(k=2, steps=50))
    assert math.isfinite(sync.updates_per_hour)
    assert async_.updates_per_hour > sync.updates_per_hour  # generation hidden behind training


def test_simulate_command_writes_table_and_plot(run_dir, tmp_path):
    from opdflow.cli import main

    out = tmp_path / "sim"
    res = CliRunner(env={"COLUMNS": "200"}).invoke(
        main,
        ["simulate", str(run_dir), "--generators", "1,4", "--k", "0,2,adaptive",
         "--steps", "40", "--replicates", "1", "--tail", "pareto:1.5:64", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "updates/h" in res.output
    rows = read_table(out / "simulate.parquet")
    assert [(r["generators"], r["k"]) for r in rows] == [
        (g, k) for g in (1, 4) for k in ("0", "2", "adaptive")
    ]
    # the verdict printed is the table's: fewest generators, then smallest fixed k, among
    # the rows whose trainer waits at most SATURATED_WAIT_SHARE of its step
    saturated = [
        (r["generators"], int(r["k"]))
        for r in rows
        if r["k"] != "adaptive" and r["trainer_wait_share"] <= SATURATED_WAIT_SHARE
    ]
    if saturated:
        g, k = min(saturated)
        said = f"smallest saturated configuration: {g} generators, k={k} ("
        assert said in res.output, res.output
        assert "no configuration keeps the trainer saturated" not in res.output
    else:
        assert "no configuration keeps the trainer saturated" in res.output, res.output
        assert "smallest saturated configuration" not in res.output
    assert (out / "simulate.png").stat().st_size > 10_000


def test_simulate_refuses_a_directory_without_spans(tmp_path):
    from opdflow.cli import main

    res = CliRunner().invoke(main, ["simulate", str(tmp_path)])
    assert res.exit_code != 0
    assert "spans.parquet is missing" in str(res.exception) + res.output
