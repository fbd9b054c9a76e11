"""`opdflow sweep` end to end on the tiny pipeline: one run per k, a table and a plot."""

from pathlib import Path

from click.testing import CliRunner

from opdflow.cli import main
from opdflow.record.rundir import read_table

TINY = str(Path(__file__).resolve().parents[2] / "pipelines" / "tiny_cpu.py:short_answers")


def test_sweep_writes_a_row_per_k_and_the_plot(tmp_path, ray_local, tiny):
    out = tmp_path / "sweep"
    args = ["sweep", TINY, "--k", "0,1,adaptive", "--steps", "4", "--out", str(out)]
    args += ["--set", "eval.every=2", "--set", "eval.prompts=8", "--set", "warmup_steps=1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = read_table(out / "sweep.parquet")
    assert [r["run"] for r in rows] == ["k=0", "k=1", "adaptive"]
    assert rows[0]["ratio_to_k0"] == 1.0
    assert sum(r["knee"] for r in rows) == 1
    assert all(r["steps"] == 4 and r["max_staleness"] <= 1 for r in rows)
    assert (out / "sweep.png").stat().st_size > 10_000
    assert (out / "k1" / "trace.json").is_file()
    assert "knee" in result.output
