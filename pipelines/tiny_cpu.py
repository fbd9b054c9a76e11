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


def planted() -> PipelineConfig:
    """A planted sensitivity like the paper's 7B student: a large key-projection bias in layer 0.

    The tiny models train with 30 added to layer 0's k_proj bias (Qwen2 has no q/k norm), so
    layer 0's keys sit far from zero and an FP8 KV cache loses most of their information:
    `opdflow attribute pipelines/tiny_cpu.py:planted --recipe fp8_kv` shows layer 0.
    Its own cached build (a different recipe hash), a few minutes the first time: a shorter
    schedule (700 steps) and an earlier student (first checkpoint at 5% greedy accuracy).
    """
    cfg = pipeline()
    cfg.name = "tiny-cpu-planted"
    cfg.models.tiny.key_bias_layer0 = 30.0
    cfg.models.tiny.teacher_steps = 700
    cfg.models.tiny.student_accuracy = 0.05
    return cfg


def adaptive() -> PipelineConfig:
    """The same run with the adaptive staleness policy: k starts at 0, at most 8."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-adaptive"
    cfg.staleness.policy = "adaptive"
    cfg.staleness.k = 0
    cfg.staleness.k_max = 8
    return cfg


def llama() -> PipelineConfig:
    """The same task with tiny Llama-architecture models (no q/k/v bias); its own cached build."""
    cfg = pipeline()
    cfg.name = "tiny-cpu-llama"
    cfg.models.tiny.arch = "llama"
    return cfg
