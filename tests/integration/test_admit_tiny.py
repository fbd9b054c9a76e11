"""The admission check on the tiny pipeline: bf16 admitted, heavy weight noise rejected."""

import json
from pathlib import Path

from click.testing import CliRunner

import opdflow.analysis.measure  # noqa: F401  (admit's measurement: an import error fails here)
from opdflow.cli import main
from opdflow.core.recipe import parse_recipe

PIPELINE = str(Path(__file__).resolve().parents[2] / "pipelines" / "tiny_cpu.py:short_answers")


def test_admit_bf16_and_reject_large_noise(tmp_path, tiny):
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({"line_nats": 0.3, "method": "runs", "d_kind": "d_total_k1"}))
    r = CliRunner().invoke(
        main,
        [
            "admit", PIPELINE, "--recipe", "bf16", "--recipe", "noise(1.0)",
            "--budget-file", str(budget), "--prompts", "8", "--json",
        ],
    )  # fmt: skip
    assert r.exit_code == 1, r.output  # 1: some candidate rejected
    out = json.loads(r.stdout)
    assert out["budget"]["line_nats"] == 0.3 and str(budget) in out["budget"]["source"]
    bf16, noise = out["decisions"]
    assert (bf16["recipe"], bf16["decision"]) == ("bf16", "ADMIT")
    assert (noise["recipe"], noise["decision"]) == (parse_recipe("noise(1.0)").text, "REJECT")
    # D_hat is the k1 estimate (unbiased, not clipped at 0): bf16's is ~1e-8 either side of 0
    assert abs(bf16["d_hat"]) < 0.01 < 0.2 < noise["d_hat"]
    assert noise["ci_low"] <= noise["d_hat"] <= noise["ci_high"]
    assert noise["full_run_s"] > noise["seconds"] > 0
