"""`opdflow calibrate --short` on a real local Ray cluster: tiny runs along the noise ladder."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from opdflow.cli import main

PIPELINE = str(Path(__file__).resolve().parents[2] / "pipelines" / "tiny_cpu.py:short_answers")


@pytest.mark.slow
def test_short_calibration_runs_the_ladder(tmp_path, ray_local, tiny):
    r = CliRunner().invoke(
        main,
        [
            "calibrate", "--short", PIPELINE, "--sigmas", "1.5", "--steps", "3",
            "--runs-dir", str(tmp_path / "runs"), "--json",
            "--set", "eval.prompts=8", "--set", "data.prompts_per_step=4",
        ],
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output  # 1: three steps need not cross tau
    budget = json.loads(r.stdout)
    assert budget["method"] == "short" and budget["d_kind"] == "d_total_k1"
    std, noisy = budget["runs"]
    assert std["recipe"] == "bf16" and std["delta"] == 0 and not std["fails"]
    assert noisy["recipe"] == "noise(1.5)" and noisy["d"] > 20 * max(std["d"], 1e-3)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["bf16", "noise-1.5"]
