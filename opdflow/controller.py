"""The controller: wires ObjectRefs between stage actors and enforces the staleness bound.

```
 prompts ──▶ GeneratorPool ──▶ Rescorer ──▶ TeacherScorer ──▶ Learner ──┐
             N engines at v     BF16 at v    logp_teacher      step n    │ version n+1
             (recipe c)         logp_rescore                   AdamW     │ ray.put
     ▲                                                                   │
     └──────────── WeightStore (versioned refs) ◀──────────────────────────┘
  bound: step n trains on a batch from version v only if n - v <= k (k = 0: synchronous)
```

Generation for step s is launched as soon as version s - k exists, with the freshest
version; batches flow stage to stage as ObjectRefs without touching the driver. The
driver waits only for the batch of the step it trains next: that wait is trainer wait.
A batch whose version broke the bound (k lowered after launch) is dropped and
regenerated, and counted. Stage construction lives in `Stages`; this module fits a screen.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from opdflow.config import PipelineConfig
from opdflow.rundir import RunDir
from opdflow.stages.assembly import Stages
from opdflow.staleness import StepObservation, launch_version, within_bound


@dataclass
class Pending:
    version: int
    ref: Any
    attempt: int = 0


def run_pipeline(
    cfg: PipelineConfig, run: RunDir, on_step: Callable[[dict], None] = lambda r: None
) -> dict:
    """Train cfg.train.steps learner steps; returns the run summary."""
    st = Stages.start(cfg, log=lambda m: run.event("log", message=m))
    policy, store = st.policy, st.store
    steps = cfg.train.steps
    pending: dict[int, Pending] = {}
    dropped, next_launch = 0, 0

    def launch(step: int, attempt: int = 0) -> None:
        v = store.latest
        gen_refs = st.pool.submit(st.requests(step, attempt, v), store.get(v))
        rescored = st.rescorer.rescore.remote(v, [store.get(v)], *gen_refs)
        pending[step] = Pending(v, st.teacher.score.remote(rescored), attempt)

    def launch_ready() -> None:
        nonlocal next_launch
        while (
            next_launch < steps and launch_version(next_launch, policy.k, store.latest) is not None
        ):
            launch(next_launch)
            next_launch += 1

    st.evaluate(0)
    launch_ready()
    t_prev_end = t_start = time.perf_counter()
    t_warm = t_start if cfg.warmup_steps == 0 else None
    for step in range(steps):
        while True:  # trainer wait: until this step's batch is scored and within the bound
            job = pending.pop(step)
            t_wait = time.perf_counter()
            ray.wait([job.ref])
            wait_s = time.perf_counter() - t_wait
            if within_bound(step, job.version, policy.k):
                break
            dropped += 1
            run.event("dropped", step=step, version=job.version, k=policy.k)
            launch(step, job.attempt + 1)
        out = ray.get(st.learner.train_step.remote(step, job.ref))
        store.publish(step + 1, out.pop("weights")[0])
        t_end = time.perf_counter()
        step_s, t_prev_end = t_end - t_prev_end, t_end
        if step + 1 == cfg.warmup_steps:
            t_warm = t_end
        timed = step + 1 - cfg.warmup_steps
        uph = 3600 * timed / (t_end - t_warm) if t_warm is not None and timed > 0 else float("nan")
        staleness = step - job.version
        decision = policy.observe(
            StepObservation(step, wait_s, step_s, out["d_stale_k1"], staleness)
        )
        if decision is not None:
            run.event("staleness", **dataclasses.asdict(decision))
        for change in st.pool.rescale(decision is not None and decision.want_more_generators):
            run.event("generator_pool", step=step, **change)
        if out["bad_steps"] > cfg.train.max_bad_steps:
            raise RuntimeError(
                f"learner: {out['bad_steps']} steps had a non-finite loss (train.max_bad_steps="
                f"{cfg.train.max_bad_steps}); lower train.lr or check the models"
            )
        launch_ready()
        store.release_below(min([p.version for p in pending.values()] + [store.latest]))
        if (step + 1) % cfg.eval.every == 0 or step + 1 == steps:
            st.evaluate(step + 1)
        row = {
            "step": step,
            "version": job.version,
            "staleness": staleness,
            "k": policy.k,
            **out,
            "trainer_wait_s": wait_s,
            "step_s": step_s,
            "updates_per_hour": uph,
            "dropped": dropped,
            "time_s": t_end - t_start,
            "live_weight_versions": len(store.live_versions()),
            "generator_replicas": st.pool.status()["ready"],
            **st.collect_evals(run, wait=False),
        }
        run.add_metrics(row)
        on_step(row)
    st.collect_evals(run, wait=True)
    summary = summarize(run, ray.get(st.learner.record.remote()), dropped)
    run.write_json("summary.json", summary)
    st.shutdown()
    return summary


def summarize(run: RunDir, record: list, dropped: int) -> dict:
    """Start/end held-out KL, throughput and mismatch over the run."""
    import numpy as np

    m = run.metrics
    by_version = {}
    for r in run.heldout:
        by_version.setdefault(r["version"], []).append(r)

    def pooled(rows):
        return sum(r["kl_sum"] for r in rows) / max(1, sum(r["tokens"] for r in rows))

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
        "dropped_batches": dropped,
        "trained_steps_record": record,
    }
