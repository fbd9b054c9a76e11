"""Learner objectives: the OPD policy gradient of DESIGN.md and its off-by-default options.

The advantage A_t = sg(logp_teacher - logp_learner) makes matching the teacher a
stationary point whatever engine produced the tokens. Pure torch; shapes in names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossOptions:
    """Off-by-default variants (see TrainConfig)."""

    advantage_from: str = "learner"
    is_clip: float = 0.0
    center_advantage: bool = False


def opd_loss(
    logp_learner_B_T: torch.Tensor,
    logp_teacher_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    logp_engine_B_T: torch.Tensor | None = None,
    options: LossOptions = LossOptions(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """-(sum_t w_t A_t logp_learner_t) / tokens with A_t = sg(logp_teacher - logp_{learner|engine})."""
    mask = mask_B_T.to(logp_learner_B_T.dtype)
    tokens = mask.sum().clamp_min(1.0)
    if options.advantage_from == "engine":
        if logp_engine_B_T is None:
            raise ValueError("advantage_from='engine' needs logp_engine")
        baseline = logp_engine_B_T
    else:
        baseline = logp_learner_B_T
    adv_B_T = (logp_teacher_B_T - baseline).detach()
    if options.center_advantage:
        adv_B_T = adv_B_T - (adv_B_T * mask).sum() / tokens
    weight_B_T = torch.ones_like(adv_B_T)
    if options.is_clip > 0:
        if logp_engine_B_T is None:
            raise ValueError("is_clip needs logp_engine")
        weight_B_T = torch.exp(logp_learner_B_T.detach() - logp_engine_B_T).clamp(
            max=options.is_clip
        )
    loss = -(weight_B_T * adv_B_T * logp_learner_B_T * mask).sum() / tokens
    with torch.no_grad():
        reverse_kl = ((logp_learner_B_T - logp_teacher_B_T) * mask).sum() / tokens
    return loss, {"loss": float(loss.detach()), "train_kl": float(reverse_kl)}
