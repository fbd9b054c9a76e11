"""The student and the teacher, and the recipe of the tiny pair opdflow builds itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from opdflow.config.rules import fail, one_of, positive


@dataclass
class TinyModelSpec:
    """How the embedded tiny teacher and student are built (a change rebuilds them)."""

    arch: str = "qwen2"
    """Architecture: "qwen2" (q/k/v bias, like DeepSeek-R1-Distill-Qwen) or "llama"."""
    hidden_size: int = 128
    """Model width. hidden_size / num_heads must be >= 32 so vLLM's CPU build can run it."""
    num_layers: int = 3
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 512
    """MLP width."""
    teacher_steps: int = 1200
    """Supervised steps on the task for the teacher (the last checkpoint)."""
    student: str = "checkpoint"
    """How the student is made: "checkpoint" (an earlier checkpoint of the teacher's run, by
    student_accuracy) or "carry_blind" (the teacher fine-tuned to drop carries on a share of
    problems: close to the teacher in weights, wrong on a skill OPD can teach it, like the
    paper's student and its RL-improved teacher; needs data.task.worked)."""
    student_accuracy: float = 0.3
    """"checkpoint": the student is the first earlier checkpoint (checked every 25 steps) whose
    held-out greedy accuracy reaches this share: a clearly weaker model from the same run."""
    carry_blind_share: float = 0.75
    """"carry_blind": share of fine-tuning targets whose carries are dropped (the rest are
    right), so the student still samples a right carry now and then."""
    carry_blind_steps: int = 30
    """"carry_blind": fine-tuning steps from the teacher (batch_size examples each)."""
    carry_blind_lr: float = 1e-3
    """"carry_blind": constant AdamW learning rate of the fine-tuning."""
    batch_size: int = 128
    """Supervised batch size, in examples."""
    lr: float = 3e-3
    """Supervised AdamW peak learning rate (warm-up, then cosine decay to 10%)."""
    label_smoothing: float = 0.1
    """Supervised label smoothing: keeps the teacher's log-probabilities of wrong tokens finite
    (about log(0.1 / vocab)) like a real LLM's, instead of -20 nats, so OPD advantages stay sane."""
    key_bias_layer0: float = 0.0
    """Planted sensitivity: add this constant to layer 0's key-projection bias on the slowest
    rotary dimensions of every key head (zoo.planted_key_dims; 0 = none): large keys an FP8
    KV cache rounds badly, which attention itself hardly notices."""
    seed: int = 0
    """Seed of initialisation and supervised data order."""
    portable_kernels: bool = False
    """Build with pinned float kernels (zoo.PINNED_KERNELS: ATen's AVX2 kernels, MKL's
    COMPATIBLE branch, 2 threads), so this recipe gives the same weights, byte for byte, on
    every x86-64 CPU with AVX2, Intel or AMD (its own cache key). Off by default: MKL's only
    vendor-independent branch is SSE2 code, about 3x the build time (the demo's: 44 s -> 122 s
    on a 2-core Xeon with AMX); a default build is reproducible per CPU type only."""

    def validate(self, path: str) -> None:
        one_of(f"{path}.arch", self.arch, ("qwen2", "llama"))
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            positive(f"{path}.{name}", getattr(self, name))
        positive(f"{path}.intermediate_size", self.intermediate_size)
        positive(f"{path}.teacher_steps", self.teacher_steps)
        one_of(f"{path}.student", self.student, ("checkpoint", "carry_blind"))
        if not 0.0 < self.student_accuracy < 1.0:
            fail(f"{path}.student_accuracy", self.student_accuracy, "a share in (0, 1)")
        if not 0.0 < self.carry_blind_share <= 1.0:
            fail(f"{path}.carry_blind_share", self.carry_blind_share, "a share in (0, 1]")
        positive(f"{path}.carry_blind_steps", self.carry_blind_steps)
        positive(f"{path}.carry_blind_lr", self.carry_blind_lr)
        positive(f"{path}.batch_size", self.batch_size)
        positive(f"{path}.lr", self.lr)
        if not 0.0 <= self.label_smoothing < 1.0:
            fail(f"{path}.label_smoothing", self.label_smoothing, "a share in [0, 1)")
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            fail(
                f"{path}.hidden_size",
                self.hidden_size,
                f"a multiple of num_heads={self.num_heads} with head size >= 32 "
                f"(e.g. hidden_size={32 * self.num_heads})",
            )
        if self.num_heads % self.num_kv_heads:
            fail(
                f"{path}.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of num_heads={self.num_heads}",
            )


@dataclass
class ModelsConfig:
    """Which student and teacher to use."""

    student: str = "tiny"
    """"tiny" (built and cached locally) or a local Hugging Face checkpoint directory."""
    teacher: str = "tiny"
    """"tiny" or a local Hugging Face checkpoint directory; must share the student's tokenizer."""
    tiny: TinyModelSpec = field(default_factory=TinyModelSpec)
    """Recipe of the tiny models, used where student or teacher is "tiny"."""
    cache_dir: str | None = None
    """Where tiny models and data are cached; default $OPDFLOW_CACHE or ~/.cache/opdflow."""

    def validate(self, path: str) -> None:
        self.tiny.validate(f"{path}.tiny")
        if (self.student == "tiny") != (self.teacher == "tiny"):
            fail(
                f"{path}.teacher",
                self.teacher,
                'both student and teacher "tiny", or both local checkpoint directories',
            )
