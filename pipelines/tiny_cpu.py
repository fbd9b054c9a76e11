"""The default demo: asynchronous OPD of the tiny arithmetic student on two CPU cores.

    opdflow run pipelines/tiny_cpu.py

Variants are more functions: `opdflow run pipelines/tiny_cpu.py:synchronous`.
"""

from opdflow.config import EvalConfig, PipelineConfig, StalenessConfig, TrainConfig


def pipeline() -> PipelineConfig:
    """bf16 rollout engine, weights up to 2 versions stale, 60 learner steps."""
    return PipelineConfig(
        name="tiny-cpu",
        train=TrainConfig(steps=60, lr=1e-4),
        eval=EvalConfig(every=20, prompts=64),
        staleness=StalenessConfig(policy="fixed", k=2),
    )


def synchronous() -> PipelineConfig:
    """The same run with k = 0 (generation waits for every update)."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-sync"
    cfg.staleness.k = 0
    return cfg
