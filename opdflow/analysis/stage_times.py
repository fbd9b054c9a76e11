"""What each stage of a measured run cost: the service times the simulator resamples.

From a finished run's spans (per generator chunk, rescorer, teacher, learner, publish and
weight fetch, warm-up steps left out) and metrics (the driver's own time per step outside
trainer wait, training and publishing), or constant times for tests and what-ifs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opdflow.analysis.runs import read_run
from opdflow.core.actor_name import stage_of
from opdflow.errors import ConfigError


@dataclass(frozen=True)
class StageTimes:
    """Service times measured in one run, as samples to resample (seconds)."""

    gen_chunk_s: np.ndarray
    """Seconds of each generator chunk."""
    gen_chunk_responses: np.ndarray
    """Responses in each of those chunks."""
    response_lengths: np.ndarray
    """Response lengths in tokens (per-chunk means: spans keep chunk totals only)."""
    rescorer_s_per_token: np.ndarray
    teacher_s_per_token: np.ndarray
    learner_s_per_token: np.ndarray
    publish_s: np.ndarray
    gen_fetch_s: np.ndarray
    rescorer_fetch_s: np.ndarray
    overhead_s: np.ndarray
    """Driver time per step outside trainer wait, training and publishing (logging, gets)."""
    prompts_per_step: int
    responses_per_prompt: int
    max_new_tokens: int
    warmup_steps: int = 2
    source: str = ""

    @classmethod
    def constant(
        cls,
        gen_s: float,
        train_s: float,
        rescore_s: float = 0.0,
        teacher_s: float = 0.0,
        publish_s: float = 0.0,
        fetch_s: float = 0.0,
        overhead_s: float = 0.0,
        prompts_per_step: int = 1,
        responses_per_prompt: int = 1,
        length: int = 1,
    ) -> StageTimes:
        """Constant times for a step of `prompts_per_step` prompts on one generator (tests)."""
        n = prompts_per_step * responses_per_prompt
        tokens = n * length

        def one(x: float) -> np.ndarray:
            return np.array([float(x)])

        return cls(
            gen_chunk_s=one(gen_s),
            gen_chunk_responses=one(n),
            response_lengths=one(length),
            rescorer_s_per_token=one(rescore_s / tokens),
            teacher_s_per_token=one(teacher_s / tokens),
            learner_s_per_token=one(train_s / tokens),
            publish_s=one(publish_s),
            gen_fetch_s=one(fetch_s),
            rescorer_fetch_s=one(fetch_s),
            overhead_s=one(overhead_s),
            prompts_per_step=prompts_per_step,
            responses_per_prompt=responses_per_prompt,
            max_new_tokens=length,
            warmup_steps=0,
            source="constant",
        )

    @classmethod
    def from_run(cls, run_dir: str | Path) -> StageTimes:
        """From RUN_DIR's spans.parquet, metrics.parquet and config.json (warm-up steps left out)."""
        run = read_run(
            run_dir,
            ("spans.parquet", "metrics.parquet", "config.json"),
            "`opdflow simulate` needs a finished run directory with spans (run a pipeline "
            "with `opdflow run ... --run-dir DIR` first)",
        )
        p, cfg, spans, metrics = run.path, run.config, run.spans, run.metrics
        warm = run.warmup_steps
        steps = {r["step"] for r in metrics}
        keep = {s for s in steps if s >= warm} if len(steps) - warm >= 3 else steps

        def pick(stage: str, actor: str | None = None) -> list[dict]:
            return [
                s
                for s in spans
                if s["stage"] == stage
                and s["step"] in keep
                and (actor is None or stage_of(s["actor"]) == actor)
            ]

        def secs(rows: list[dict]) -> np.ndarray:
            return np.array([r["end_s"] - r["start_s"] for r in rows], float)

        def per_token(stage: str) -> np.ndarray:
            rows = [r for r in pick(stage) if r["tokens"] > 0]
            return secs(rows) / np.array([r["tokens"] for r in rows], float)

        d, e = cfg["data"], cfg["engine"]
        prompts, rpp = int(d["prompts_per_step"]), int(d["responses_per_prompt"])
        gen = [r for r in pick("generator") if r["tokens"] > 0]
        n_chunk = prompts * rpp / min(int(e["replicas"]), prompts)
        learner = {r["step"]: r["end_s"] - r["start_s"] for r in pick("learner")}
        publish = {r["step"]: r["end_s"] - r["start_s"] for r in pick("publish")}
        overhead = [
            max(m["step_s"] - m["trainer_wait_s"] - learner[m["step"]] - publish[m["step"]], 0.0)
            for m in metrics
            if m["step"] in keep and m["step"] in learner and m["step"] in publish
        ]
        out = cls(
            gen_chunk_s=secs(gen),
            gen_chunk_responses=np.full(len(gen), n_chunk),
            response_lengths=np.array([r["tokens"] / n_chunk for r in gen], float),
            rescorer_s_per_token=per_token("rescorer"),
            teacher_s_per_token=per_token("teacher"),
            learner_s_per_token=per_token("learner"),
            publish_s=secs(pick("publish")),
            gen_fetch_s=secs(pick("fetch", "generator")),
            rescorer_fetch_s=secs(pick("fetch", "rescorer")),
            overhead_s=np.array(overhead or [0.0], float),
            prompts_per_step=prompts,
            responses_per_prompt=rpp,
            max_new_tokens=int(e["max_new_tokens"]),
            warmup_steps=warm,
            source=str(p),
        )
        for name in ("gen_chunk_s", "rescorer_s_per_token", "teacher_s_per_token"):
            if len(getattr(out, name)) == 0:
                raise ConfigError(
                    f"{p}/spans.parquet has no {name.split('_')[0]} spans with tokens"
                )
        if len(out.learner_s_per_token) == 0:
            raise ConfigError(f"{p}/spans.parquet has no learner spans with tokens")
        return out
