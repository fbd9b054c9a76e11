"""The rescorer: the BF16 student at the generator's version v scores the engine's tokens.

logp_rescore - logp_engine on the very tokens the engine produced is the engine's own
mismatch (d_engine), free of staleness; with full distributions it is exact. `Rescorer`
computes on its device with no Ray; `RescorerActor` wraps it for the pipeline.
"""

from __future__ import annotations

from typing import Any

from opdflow.compute.device import stage_device
from opdflow.compute.scoring import DEFAULT_CHUNK_TOKENS, score_batch
from opdflow.core.rollout import RolloutBatch, concat
from opdflow.stages.actor import StageActor, pin_threads
from opdflow.stages.specs import RescorerSpec
from opdflow.weights.version import WeightsRef


class Rescorer:
    """The BF16 student following the weights versions it is given."""

    def __init__(
        self,
        model_path: str,
        temperature: float = 1.0,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        micro_batch_tokens: int = 0,
        device: str | None = None,
    ):
        from opdflow.inputs.models import load_model

        self.device = stage_device(device)
        self.model = load_model(model_path, "bfloat16", str(self.device))
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens
        self.version = 0

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy a weights version into the model (host to device on a GPU): its one copy."""
        from opdflow.weights.loader import load_module

        load_module(self.model, state)
        self.version = version

    def rescore(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch with logp_rescore (and the exact engine KL where it carries the engine's
        distributions, which are then dropped), micro-batch by micro-batch."""
        scores = score_batch(
            self.model, batch, self.micro_batch_tokens, self.temperature, self.chunk_tokens
        )
        return batch.replace(
            logp_rescore_B_T=scores.logp_B_T,
            kl_engine_exact_B_T=None if scores.kl_B_T is None else scores.kl_B_T.astype("float32"),
            logdist_engine_B_T_V=None,
        )


class RescorerActor(StageActor):
    """The rescorer as a Ray actor: fetches the versions it is handed, records spans."""

    def __init__(self, spec: RescorerSpec):
        pin_threads(spec.threads)
        self.stage = Rescorer(spec.model, spec.temperature, spec.chunk_tokens,
                              spec.micro_batch_tokens)  # fmt: skip

    def rescore(self, weights: WeightsRef, *batches: RolloutBatch, step: int = -1) -> RolloutBatch:
        """The batches, concatenated, rescored by the student at `weights`."""
        stage = self.stage
        self.ensure_weights(weights, stage.version, step, stage.load_weights, stage.device)
        with self.span("rescorer", step, weights.version) as s:
            batch = concat(list(batches))
            s["tokens"] = batch.num_tokens
            return stage.rescore(batch)
