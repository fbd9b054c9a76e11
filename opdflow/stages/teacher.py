"""The teacher scorer: a prefill that returns log p_T of the student's sampled tokens.

`TeacherScorer` computes on its device with no Ray; `TeacherActor` wraps it.
"""

from __future__ import annotations

from opdflow.compute.device import stage_device
from opdflow.compute.scoring import DEFAULT_CHUNK_TOKENS, score_batch
from opdflow.core.rollout import RolloutBatch
from opdflow.stages.actor import StageActor, pin_threads
from opdflow.stages.specs import TeacherSpec


class TeacherScorer:
    """The fixed teacher in BF16."""

    def __init__(
        self,
        model_path: str,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        micro_batch_tokens: int = 0,
        device: str | None = None,
    ):
        from opdflow.inputs.models import load_model

        self.device = stage_device(device)
        self.model = load_model(model_path, "bfloat16", str(self.device))
        self.chunk_tokens = chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens

    def score(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch with logp_teacher, micro-batch by micro-batch."""
        scores = score_batch(
            self.model, batch, self.micro_batch_tokens, chunk_tokens=self.chunk_tokens
        )
        return batch.replace(logp_teacher_B_T=scores.logp_B_T)


class TeacherActor(StageActor):
    """The teacher scorer as a Ray actor."""

    def __init__(self, spec: TeacherSpec):
        pin_threads(spec.threads)
        self.stage = TeacherScorer(spec.model, spec.chunk_tokens, spec.micro_batch_tokens)

    def score(self, batch: RolloutBatch, step: int = -1) -> RolloutBatch:
        with self.span("teacher", step, batch.version) as s:
            s["tokens"] = batch.num_tokens
            return self.stage.score(batch)
