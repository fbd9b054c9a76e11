"""A finished run's summary: held-out KL and accuracy, throughput, mismatch, faults.

What `opdflow run` prints at the end and writes to summary.json, read off the run
directory (metrics, held-out rows, events), so any run directory can be summarised again.
"""

from __future__ import annotations

from opdflow.analysis.faults import learner_losses, node_losses, restart_slowdown
from opdflow.record.rundir import RunDir


def summarize(run: RunDir, record: list, dropped: int, start_step: int = 0) -> dict:
    """Start/end held-out KL and accuracy, throughput and mismatch over the run, stage
    restarts (per stage, from events.jsonl) with the share of updates/hour they cost, and
    each learner loss it healed from (faults.learner_losses). `start_step`: the step this
    process started at (a resumed run's checkpoint).

    Accuracy is the share of held-out responses whose answer matches the reference, NaN
    when the held-out prompts have no reference answers."""
    import numpy as np

    from opdflow.inputs.data import heldout_has_answers

    m = run.metrics
    by_version = {}
    for r in run.heldout:
        by_version.setdefault(r["version"], []).append(r)

    def pooled(rows):
        return sum(r["kl_sum"] for r in rows) / max(1, sum(r["tokens"] for r in rows))

    answers = heldout_has_answers(run.config().get("data", {}).get("heldout", "tiny"))

    def accuracy(rows):  # every prompt has the same number of responses
        acc = [r.get("accuracy") for r in rows]
        ok = answers is not False and acc and all(a is not None for a in acc)
        return float(np.mean(acc)) if ok else float("nan")

    timed = len(m) - start_step - run.config().get("warmup_steps", 0)  # what updates/hour counts
    first, last = min(by_version), max(by_version)
    kl0, kl1 = pooled(by_version[first]), pooled(by_version[last])
    tokens = np.array([r["tokens"] for r in m], float)

    def tok_mean(key):
        v = np.array([r[key] for r in m], float)
        ok = np.isfinite(v)
        return float((v[ok] * tokens[ok]).sum() / max(tokens[ok].sum(), 1))

    return {
        "run_dir": str(run.path),
        "steps": len(m),
        "heldout_kl_start": kl0,
        "heldout_kl_end": kl1,
        "heldout_kl_change": (kl1 - kl0) / kl0 if kl0 else float("nan"),
        "heldout_accuracy_start": accuracy(by_version[first]),
        "heldout_accuracy_end": accuracy(by_version[last]),
        "heldout_version_start": first,
        "heldout_version_end": last,
        "updates_per_hour": m[-1]["updates_per_hour"],
        "trainer_wait_s_mean": float(np.mean([r["trainer_wait_s"] for r in m])),
        "trainer_wait_share": float(
            sum(r["trainer_wait_s"] for r in m) / max(sum(r["step_s"] for r in m), 1e-9)
        ),
        "d_engine_k1": tok_mean("d_engine_k1"),
        "d_engine_k3": tok_mean("d_engine_k3"),
        "d_engine_exact": tok_mean("d_engine_exact"),
        "d_stale_k1": tok_mean("d_stale_k1"),
        "d_stale_k3": tok_mean("d_stale_k3"),
        "d_total_k1": tok_mean("d_total_k1"),
        "max_staleness": int(max(r["staleness"] for r in m)),
        "live_weight_versions_max": int(max(r["live_weight_versions"] for r in m)),
        "weight_bytes_live_max": int(max(r.get("weight_bytes_live", 0) for r in m)),
        "dropped_batches": dropped,
        "restarts": run.restart_counts(),
        "restart_slowdown": restart_slowdown(m, run.config().get("warmup_steps", 0)),
        "learner_losses": learner_losses(run.events(), m[-1]["updates_per_hour"], timed),
        "node_losses": node_losses(run.events(), m),
        "trained_steps_record": record,
    }
