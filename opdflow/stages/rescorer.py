"""The rescorer: the BF16 student at the generator's version v scores the engine's tokens.

logp_rescore - logp_engine on the very tokens the engine produced is the engine's own
mismatch (d_engine), free of staleness; with full distributions it is exact.
"""

from __future__ import annotations

import torch

from opdflow.rollout import RolloutBatch, concat
from opdflow.scoring import DEFAULT_CHUNK_TOKENS, score_tokens
from opdflow.stages import VersionedModel, pin_threads


class Rescorer(VersionedModel):
    """BF16 student (a Ray actor) that follows the weights versions it is asked for."""

    def __init__(
        self,
        model_path: str,
        threads: int,
        temperature: float = 1.0,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ):
        from opdflow.models import load_model

        pin_threads(threads)
        self.model = load_model(model_path, "bfloat16")
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.version = 0

    @torch.no_grad()
    def rescore(
        self, version: int, weights_box: list, *batches: RolloutBatch, step: int = -1
    ) -> RolloutBatch:
        self._ensure_version(version, weights_box, step)
        with self.span("rescorer", step, version) as s:
            batch = concat(list(batches))
            s["tokens"] = batch.num_tokens
            return self._rescore(batch)

    def _rescore(self, batch: RolloutBatch) -> RolloutBatch:
        scores = score_tokens(
            self.model,
            batch,
            self.temperature,
            ref_logdist_B_T_V=batch.logdist_engine_B_T_V,
            chunk_tokens=self.chunk_tokens,
        )
        kl = None if scores.kl_B_T is None else scores.kl_B_T.numpy().astype("float32")
        return batch.replace(
            logp_rescore_B_T=scores.logp_B_T.numpy(),
            kl_engine_exact_B_T=kl,
            logdist_engine_B_T_V=None,
        )
