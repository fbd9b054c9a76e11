"""Gradient error of one OPD update under a mismatched rollout engine, split in two parts.

The study's question 5 and 7 (docs/DESIGN.md, "The study"): a mismatched engine c changes an OPD
update in two ways. It samples different tokens, so training sees prefixes the BF16
student would not reach (prefix shift); and where a system takes the student's logprob
in the advantage from the engine instead of the learner, every token's advantage is off
by logp_engine - logp_learner (per-token error). With one batch of prompts and common
random numbers (the same sampling seed for both engines, so their samples coincide where
their distributions agree):

    g_ref    tokens from the BF16 engine, A = logp_teacher - logp_learner   (the update)
    g_shift  tokens from engine c,        A = logp_teacher - logp_learner   (opdflow default)
    g_full   tokens from engine c,        A = logp_teacher - logp_engine    (full mismatch)

prefix shift = |g_shift - g_ref|, per-token = |g_full - g_shift| (same tokens, no sampling
noise), total = |g_full - g_ref|; each also divided by |g_ref| (error-to-update ratio).
The floor is |g_ref' - g_ref| for an independent BF16 sample: sampling noise alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from opdflow.config import PipelineConfig


@dataclass(frozen=True)
class GradientErrors:
    """One engine's gradient errors at one student, in gradient-norm units."""

    recipe: str
    student: str
    """Which student the update is taken at, e.g. "untrained" or "step 120"."""
    update: float
    """|g_ref|: the norm of the BF16 update."""
    prefix_shift: float
    per_token: float
    total: float
    floor: float
    """|g_ref' - g_ref|, an independent BF16 sample: what sampling noise alone gives."""
    d_engine: float
    """Engine mismatch on this sample, nats/token (k1)."""
    responses: int

    def ratio(self, part: str) -> float:
        """Error-to-update ratio of one part ("prefix_shift", "per_token", "total")."""
        return getattr(self, part) / self.update

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            **{f"{p}_ratio": self.ratio(p) for p in ("prefix_shift", "per_token", "total")},
        }


class GradientProbe:
    """The student (FP32, as the learner holds it), the teacher and a fixed prompt batch."""

    def __init__(
        self,
        cfg: PipelineConfig,
        weights: dict | None = None,
        label: str = "untrained",
        prompts: int = 64,
        responses_per_prompt: int = 8,
        seed: int = 0,
    ):
        """weights: FP32 student state (e.g. a run's checkpoint); None = the untrained student."""
        import torch

        from opdflow.inputs.data import load_prompts
        from opdflow.inputs.models import load_model, load_tokenizer, resolve_models

        self.cfg, self.label, self.seed, self.n = cfg, label, seed, responses_per_prompt
        self.paths = resolve_models(cfg, log=lambda _m: None)
        self.tok = load_tokenizer(self.paths.tokenizer)
        self.prompts = load_prompts(
            self.paths.train, self.tok, cfg.data.max_prompt_tokens, limit=prompts
        )
        self.student = load_model(self.paths.student, "float32")
        if weights is not None:
            self.student.load_state_dict(weights, strict=True)
        self.bf16_state = {k: v.to(torch.bfloat16) for k, v in self.student.state_dict().items()}
        self.teacher = load_model(self.paths.teacher, "bfloat16")

    def _batch(self, recipe: str, seed: int):
        import torch

        from opdflow.compute.scoring import token_logprobs
        from opdflow.engines.base import GenerationRequest, SamplingParams
        from opdflow.engines.torch_engine import TorchEngine

        engine = TorchEngine(
            self.paths.student, self.tok.pad_token_id, self.tok.eos_token_id, recipe
        )
        engine.load_weights(self.bf16_state, 0)
        e = self.cfg.engine
        p = self.prompts
        batch = engine.generate(
            GenerationRequest(
                p.token_ids,
                list(range(len(p))),
                p.answers,
                self.n,
                seed,
                0,
                SamplingParams(e.temperature, e.top_p, e.max_new_tokens),
            )
        )
        with torch.no_grad():
            teacher, _ = token_logprobs(self.teacher, batch, e.temperature)
        return batch.replace(logp_teacher_B_T=teacher.float().numpy())

    def _grad(self, batch, advantage_from: str):
        import torch

        from opdflow.compute.losses import LossOptions, policy_loss
        from opdflow.compute.scoring import token_logprobs

        self.student.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(self.student, batch, self.cfg.engine.temperature)
        loss, _ = policy_loss(
            logp,
            torch.from_numpy(batch.logp_teacher_B_T),
            torch.from_numpy(batch.response_mask_B_T),
            torch.from_numpy(batch.logp_engine_B_T),
            LossOptions(advantage_from=advantage_from),
        )
        loss.backward()
        g = torch.cat([p.grad.flatten() for p in self.student.parameters() if p.grad is not None])
        mismatch = (batch.logp_engine_B_T - logp.detach().numpy()) * batch.response_mask_B_T
        return g, float(mismatch.sum() / max(batch.response_mask_B_T.sum(), 1))

    def errors(self, recipe: str) -> GradientErrors:
        """The three errors of engine `recipe` against the BF16 engine, and the noise floor."""
        ref = self._batch("bf16", self.seed)
        g_ref, _ = self._grad(ref, "learner")
        g_ref2, _ = self._grad(self._batch("bf16", self.seed + 7919), "learner")
        c = self._batch(recipe, self.seed)
        g_shift, _ = self._grad(c, "learner")
        g_full, d = self._grad(c, "engine")
        return GradientErrors(
            recipe=recipe,
            student=self.label,
            update=float(g_ref.norm()),
            prefix_shift=float((g_shift - g_ref).norm()),
            per_token=float((g_full - g_shift).norm()),
            total=float((g_full - g_ref).norm()),
            floor=float((g_ref2 - g_ref).norm()),
            d_engine=d,
            responses=c.num_responses,
        )
