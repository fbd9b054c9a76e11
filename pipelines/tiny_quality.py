"""Tiny runs long enough for the quality rule: the calibration set behind `opdflow calibrate`.

    opdflow run pipelines/tiny_quality.py --set engine.recipe='noise(1.5)'
    opdflow calibrate RUN ... --std RUN_BF16 --out budget.json
    opdflow calibrate --short pipelines/tiny_quality.py --steps 30

Compared with tiny_cpu: 120 steps at lr 2e-4, so the standard run lowers held-out KL far
enough that a 20% worse run is distinguishable, and 128 held-out prompts (of 256) for
tighter paired intervals. Everything else, the engine recipe included, is the default.
"""

from opdflow.config import EvalConfig, PipelineConfig, StalenessConfig, TrainConfig


def pipeline() -> PipelineConfig:
    """bf16 rollout engine (vary it with --set engine.recipe=...), k = 2, 120 steps."""
    return PipelineConfig(
        name="tiny-quality",
        train=TrainConfig(steps=120, lr=2e-4),
        staleness=StalenessConfig(policy="fixed", k=2),
        eval=EvalConfig(every=40, prompts=128, samples_per_prompt=4),
    )
