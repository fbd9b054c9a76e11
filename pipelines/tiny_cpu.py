"""The default demo: asynchronous OPD of the tiny arithmetic student on two CPU cores.

    opdflow run pipelines/tiny_cpu.py

Variants are more functions: `opdflow run pipelines/tiny_cpu.py:synchronous`.
"""

from opdflow.config import EvalConfig, PipelineConfig, StalenessConfig, TrainConfig
from opdflow.testbed.tiny import worked


def pipeline() -> PipelineConfig:
    """The worked testbed (opdflow.testbed.tiny.worked), weights up to 2 versions stale, 60 steps.

    Responses write out every column (~31 tokens); the student is its teacher fine-tuned to
    drop carries on 3 problems in 4. Its own cached build (about a minute the first time).

    The tiny student moves far more per step than the paper's 7B (d_stale ~0.14
    nats/token at k = 2 against 0.0028 at k = 8): without an importance weight the stale
    samples keep pushing down tokens the learner has already left, and held-out KL rises
    (0.304 -> 0.822 in 60 steps, `--set train.is_clip=0`). The truncated weight
    min(pi_learner / pi_engine, 3) (train.is_clip) stops that: held-out KL falls 61-67%
    (seeds 0, 1), as at k = 0 (-66%). At k = 4 it diverges with or without the weight.
    """
    cfg = worked()
    cfg.name = "tiny-cpu"
    cfg.train.steps = 60
    cfg.train.is_clip = 3.0
    cfg.eval = EvalConfig(every=20, prompts=64)
    cfg.staleness = StalenessConfig(policy="fixed", k=2)
    return cfg


def synchronous() -> PipelineConfig:
    """The same run with k = 0 (generation waits for every update)."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-sync"
    cfg.staleness.k = 0
    return cfg


def adaptive() -> PipelineConfig:
    """The same run with the adaptive staleness policy: k starts at 0, at most 2 (this
    student diverges at k = 4)."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-adaptive"
    cfg.staleness.policy = "adaptive"
    cfg.staleness.k = 0
    cfg.staleness.k_max = 2
    return cfg


def llama() -> PipelineConfig:
    """The same run with tiny Llama-architecture models (no q/k/v bias); its own cached build."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-llama"
    cfg.models.tiny.arch = "llama"
    return cfg


def short_answers() -> PipelineConfig:
    """The first testbed: answers only ("582", 4 tokens), the student an early checkpoint
    of the teacher's own training (30% greedy accuracy), no importance weight.

    The test fixtures use these models (the config defaults); the study runs the demo's
    (opdflow.testbed.tiny.worked). OPD moves it little in 60 steps: held-out KL falls ~17%.
    """
    return PipelineConfig(
        name="tiny-cpu-short",
        train=TrainConfig(steps=60, lr=1e-4),
        eval=EvalConfig(every=20, prompts=64),
        staleness=StalenessConfig(policy="fixed", k=2),
    )


def planted() -> PipelineConfig:
    """A planted sensitivity like the paper's 7B student: a large key-projection bias in layer 0.

    The short-answer models (the same schedule and student) trained with 400 added to layer
    0's k_proj bias on the slowest-turning rotary dimensions of each key head (Qwen2 has no
    q/k norm): attention hardly changes, but an FP8 KV cache loses most of those keys'
    information: `opdflow attribute pipelines/tiny_cpu.py:planted --recipe fp8_kv` shows
    layer 0. Its own cached build (a different recipe hash), about two minutes the first
    time. +400 is what makes escaping layer 0 cut D at least 10x on every kernel build
    tried (88x to 351x; README, "Precision recipes").
    """
    cfg = short_answers()
    cfg.name = "tiny-cpu-planted"
    cfg.models.tiny.key_bias_layer0 = 400.0
    return cfg
