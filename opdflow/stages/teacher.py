"""The teacher scorer: a prefill that returns log p_T of the student's sampled tokens."""

from __future__ import annotations

import torch

from opdflow.rollout import RolloutBatch
from opdflow.scoring import DEFAULT_CHUNK_TOKENS, token_logprobs
from opdflow.stages import StageActor, pin_threads


class TeacherScorer(StageActor):
    """The fixed teacher in BF16 (a Ray actor)."""

    def __init__(self, model_path: str, threads: int, chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        from opdflow.models import load_model

        pin_threads(threads)
        self.model = load_model(model_path, "bfloat16")
        self.chunk_tokens = chunk_tokens

    @torch.no_grad()
    def score(self, batch: RolloutBatch, step: int = -1) -> RolloutBatch:
        with self.span("teacher", step, batch.version) as s:
            s["tokens"] = batch.num_tokens
            logp, _ = token_logprobs(self.model, batch, chunk_tokens=self.chunk_tokens)
        return batch.replace(logp_teacher_B_T=logp.numpy())
