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

    The tiny models train with 100 added to layer 0's k_proj bias on the slowest-turning
    rotary dimensions of each key head (Qwen2 has no q/k norm): attention hardly changes,
    but an FP8 KV cache loses most of those keys' information:
    `opdflow attribute pipelines/tiny_cpu.py:planted --recipe fp8_kv` shows layer 0.
    Its own cached build (a different recipe hash), a few minutes the first time: a shorter
    schedule (700 steps) and an earlier student (first checkpoint at 5% greedy accuracy).
    """
    cfg = pipeline()
    cfg.name = "tiny-cpu-planted"
    cfg.models.tiny.key_bias_layer0 = 100.0
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


def worked() -> PipelineConfig:
    """The worked-solution testbed: ~31-token responses and a student a few steps from its teacher.

    Responses write out every column ("3+9+0=12,2+5+1=08,1+4+0=05:582"), so a wrong early
    token shifts every later prefix. The teacher trains 200 steps; the student is that
    teacher fine-tuned 30 steps to drop carries on 3 problems in 4 (models.tiny.student =
    "carry_blind"): wrong exactly where OPD's per-token teacher signal can show it the carry.
    Its own cached build (about two minutes the first time).

    Synchronous (k = 0) at lr 2e-4: held-out KL falls 66% in 60 steps. With k = 2 the same
    run diverges (held-out KL rises): d_stale at k = 2 is 0.14 nats/token, far from the
    paper's regime (0.0028 at k = 8).
    """
    cfg = pipeline()
    cfg.name = "tiny-cpu-worked"
    cfg.data.task.worked = True
    cfg.engine.max_new_tokens = 32
    tiny = cfg.models.tiny
    tiny.student = "carry_blind"
    tiny.teacher_steps = 200
    tiny.batch_size = 64
    tiny.label_smoothing = 0.01  # ~0.99 per right token: 31-token responses stay sampleable
    cfg.train.lr = 2e-4
    cfg.staleness.k = 0
    return cfg
