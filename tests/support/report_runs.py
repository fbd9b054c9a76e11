"""Run directories with known numbers for report tests (written through RunDir, like a run)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.record.rundir import RunDir


def _write_spans(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path / "spans.parquet")


def make_run(
    root: Path,
    k: int,
    steps: int = 12,
    gen_s: float = 0.3,
    train_s: float = 0.2,
    spans: bool = True,
) -> Path:
    """A run whose generator takes gen_s and learner train_s per step, overlapped up to k.

    Step time is max(gen_s, train_s) when k > 0 (overlap), gen_s + train_s when k = 0;
    trainer wait is the part of the step the learner is not training.
    """
    cfg = apply_overrides(
        PipelineConfig(name=f"k{k}"), [f"staleness.k={k}", f"train.steps={steps}"]
    )
    run = RunDir.create(cfg, root / f"k{k}")
    step_s = gen_s + train_s if k == 0 else max(gen_s, train_s)
    wait_s = step_s - train_s
    t, span_rows = 0.0, []
    for step in range(steps):
        t += step_s
        version = max(0, step - k)
        run.add_metrics(
            {
                "step": step,
                "version": version,
                "staleness": step - version,
                "k": k,
                "loss": 1.0 / (step + 1),
                "tokens": 320,
                "d_engine_k1": 1e-4 * (1 + 0.1 * math.sin(step)),
                "d_engine_k3": 1e-4,
                "d_engine_exact": 1.1e-4,
                "d_stale_k1": 0.002 * (step - version),
                "d_stale_k3": 0.001 * (step - version),
                "trainer_wait_s": wait_s,
                "step_s": step_s,
                "updates_per_hour": 3600 / step_s,
                "gen_s": gen_s,
                "train_s": train_s,
                "time_s": t,
                "heldout_kl": float("nan"),
            }
        )
        g0 = t - step_s
        span_rows += [
            {
                "stage": "generator",
                "actor": f"gen{step % 2}",
                "step": step,
                "version": version,
                "start_s": g0,
                "end_s": g0 + gen_s,
                "tokens": 320,
                "bytes": 0,
            },
            {
                "stage": "learner",
                "actor": "learner",
                "step": step,
                "version": version,
                "start_s": t - train_s,
                "end_s": t,
                "tokens": 320,
                "bytes": 0,
            },
            {
                "stage": "publish",
                "actor": "learner",
                "step": step,
                "version": step + 1,
                "start_s": t - 0.01,
                "end_s": t,
                "tokens": 0,
                "bytes": 1_500_000,
            },
        ]
    for v in range(0, steps + 1, 4):
        kl = 2.4 * math.exp(-v / (20 + 5 * k))
        run.add_heldout(
            [
                {
                    "version": v,
                    "prompt_index": i,
                    "kl_sum": kl * 10,
                    "tokens": 10,
                    "kl": kl,
                    "accuracy": min(1.0, 0.2 + 0.05 * v + 0.1 * (i % 2)),
                }
                for i in range(4)
            ]
        )
    if spans:
        _write_spans(run.path, span_rows)
    return run.path


def make_sweep(root: Path, ks=(0, 1, 2, 4), admission: bool = True) -> Path:
    """A sweep directory: one run per k (the first without spans) and an admission.json."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    for i, k in enumerate(ks):
        make_run(root, k, spans=i > 0)
    if admission:
        (root / "admission.json").write_text(
            json.dumps(
                [
                    {
                        "recipe": "bf16",
                        "d_hat": 1.2e-4,
                        "ci_low": 0.9e-4,
                        "ci_high": 1.5e-4,
                        "decision": "admit",
                        "seconds": 3.1,
                    },
                    {
                        "recipe": "noise(0.5)",
                        "d_hat": 0.11,
                        "ci_low": 0.09,
                        "ci_high": 0.13,
                        "decision": "reject",
                        "seconds": 3.4,
                    },
                ]
            )
        )
    return root


# a sweep to look at: PYTHONPATH=.:tests python -m support.report_runs DIR
if __name__ == "__main__":
    import sys

    print(make_sweep(Path(sys.argv[1] if len(sys.argv) > 1 else os.getcwd()) / "sweep"))
