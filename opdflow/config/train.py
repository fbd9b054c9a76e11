"""The learner: optimiser, objective and the token budgets its forwards keep to."""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import in_range, nonnegative, one_of, positive


@dataclass
class TrainConfig:
    """The learner: optimiser and objective."""

    steps: int = 40
    """Learner steps (weight versions produced)."""
    lr: float = 1e-4
    """AdamW learning rate (after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps (0 = none): AdamW's first updates
    move every weight by about lr whatever its gradient, which knocks a student off course."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 = off)."""
    loss: str = "opd"
    """"opd" (teacher-student log ratio advantage), or the RL baselines "reinforce", "grpo"."""
    advantage_from: str = "learner"
    """Whose logprob the OPD advantage subtracts: "learner" (default) or "engine"."""
    is_clip: float = 0.0
    """Truncated importance weight min(exp(logp_learner - logp_engine), C); 0 = off."""
    center_advantage: bool = False
    """Subtract the batch-mean advantage (score centering)."""
    max_bad_steps: int = 3
    """Steps with a NaN/inf loss are skipped; the run stops after this many."""
    logit_chunk_tokens: int = 1024
    """Response tokens whose full-vocabulary logits exist at once when the learner, rescorer,
    teacher and evaluator score tokens (logp, entropy, exact KL and their gradient): memory
    ~ this x vocabulary x 4 bytes x a few (1024 x 150k vocab: ~0.6 GB per copy), never the
    whole batch's B x T x vocabulary."""
    micro_batch_tokens: int = 16384
    """Token budget of one forward, in padded tokens (rows x (widest prompt + widest
    response)): the learner packs a step's responses into micro-batches of at most this many
    and accumulates their gradients (normalised by the whole step's tokens: the same
    gradient as one full-batch step); the rescorer, the teacher and the evaluator's prefill
    use the same budget. Memory follows this, not the batch. At least
    data.max_prompt_tokens + engine.max_new_tokens (a response is never split); 0 = the
    whole batch in one forward."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them:
    the learner's activation memory drops to one layer's plus each layer's input, for about
    a third more compute."""
    compute_dtype: str = "auto"
    """The sharded (FSDP2) learner's compute dtype: parameters all-gathered and matmuls run
    in it, while master weights, gradients' reduction and AdamW stay FP32. "auto" =
    "bfloat16" on GPUs, "float32" on CPUs (where bf16 matmuls are emulated on many CPUs and a
    data-parallel learner then matches one worker only to bf16 precision)."""

    def validate(self, path: str) -> None:
        positive(f"{path}.steps", self.steps)
        positive(f"{path}.lr", self.lr)
        nonnegative(f"{path}.weight_decay", self.weight_decay)
        nonnegative(f"{path}.grad_clip", self.grad_clip)
        one_of(f"{path}.loss", self.loss, ("opd", "reinforce", "grpo"))
        one_of(f"{path}.advantage_from", self.advantage_from, ("learner", "engine"))
        nonnegative(f"{path}.is_clip", self.is_clip)
        nonnegative(f"{path}.max_bad_steps", self.max_bad_steps)
        nonnegative(f"{path}.warmup_steps", self.warmup_steps)
        in_range(f"{path}.logit_chunk_tokens", self.logit_chunk_tokens, 1, 2**31 - 1)
        in_range(f"{path}.micro_batch_tokens", self.micro_batch_tokens, 0, 2**31 - 1)
        one_of(f"{path}.compute_dtype", self.compute_dtype, ("auto", "bfloat16", "float32"))
