"""`opdflow calibrate --short` on a real local Ray cluster: tiny runs along the noise ladder."""

import json
import math
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
    assert r.stdout.lstrip().startswith("{"), r.output  # it got as far as the budget
    budget = json.loads(r.stdout)
    assert budget["method"] == "short" and budget["d_kind"] == "d_total_k1"
    std, noisy = budget["runs"]
    assert std["recipe"] == "bf16" and std["delta"] == 0 and not std["fails"]
    assert noisy["recipe"] == "noise(1.5)" and noisy["d"] > 20 * max(std["d"], 1e-3)
    # Whether three steps move Delta past tau is the runs' outcome; what the command makes
    # of it is not. With two rungs (bf16 at Delta 0 < tau, then noise) Delta crosses tau
    # iff the noisy run's Delta >= tau; L is then interpolated linearly in log D between
    # them, and the command exits 0 exactly when it has a line.
    tau = budget["tau"]
    crosses = std["d"] > 0 and noisy["delta"] >= tau
    assert r.exit_code == (0 if crosses else 1), r.output
    if crosses:
        f = tau / noisy["delta"]
        line = math.exp(math.log(std["d"]) + f * (math.log(noisy["d"]) - math.log(std["d"])))
        assert budget["line_nats"] == pytest.approx(line, rel=1e-9), budget
        assert std["d"] < budget["line_nats"] <= noisy["d"]
    else:
        assert budget["line_nats"] is None, budget
        assert "Delta never reaches tau" in r.output or std["d"] == 0, r.output
    # the bracket, from the verdicts: bf16 passes; a failing noise run closes the bracket
    # above it, a passing one is the largest passing D
    if noisy["fails"]:
        assert (budget["status"], budget["bracket"]) == ("bracket", [std["d"], noisy["d"]])
    else:
        assert (budget["status"], budget["bracket"]) == ("all_pass", [noisy["d"], None])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["bf16", "noise-1.5"]
