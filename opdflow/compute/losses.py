"""Learner objectives: the OPD policy gradient of docs/DESIGN.md, its off-by-default options,
and the RL baselines the study compares it with.

The OPD advantage A_t = sg(logp_teacher - logp_learner) makes matching the teacher a
stationary point whatever engine produced the tokens. The RL baselines (REINFORCE, GRPO)
have no such anchor: their advantage is a 0/1 correctness reward per response, the same
for every token. Every objective is the same token-level policy gradient
-(sum_t w_t A_t logp_learner_t) / tokens; only A differs. Pure torch; shapes in names.
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
    loss: str = "opd"


def rl_advantage(reward_B: torch.Tensor, group_B: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-response advantage: "reinforce" = the reward itself (no baseline); "grpo" = the
    reward standardised within its prompt's group of responses (mean 0, std 1; 0 where the
    group's rewards are all equal)."""
    if kind == "reinforce":
        return reward_B
    if kind != "grpo":
        raise ValueError(f"unknown RL objective {kind!r}: expected 'reinforce' or 'grpo'")
    _, inv = torch.unique(group_B, return_inverse=True)
    n = torch.zeros(int(inv.max()) + 1).index_add_(0, inv, torch.ones_like(reward_B))
    mean = torch.zeros_like(n).index_add_(0, inv, reward_B) / n
    var = torch.zeros_like(n).index_add_(0, inv, (reward_B - mean[inv]) ** 2) / n
    return (reward_B - mean[inv]) / (var[inv].sqrt() + 1e-6)


def advantage(
    logp_learner_B_T: torch.Tensor | None,
    logp_teacher_B_T: torch.Tensor | None,
    mask_B_T: torch.Tensor,
    logp_engine_B_T: torch.Tensor | None = None,
    options: LossOptions = LossOptions(),
    reward_B: torch.Tensor | None = None,
    group_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """A_t (no gradient): sg(logp_teacher - logp_{learner|engine}) for "opd", the per-response
    RL advantage of `reward_B` (grouped by `group_B`) for "reinforce" and "grpo"; centred on
    the masked tokens' mean when asked. Centring couples every token of the batch, so it is
    computed on the whole batch even when the gradient is taken micro-batch by micro-batch."""
    mask = mask_B_T.to(torch.float32)
    if options.loss == "opd":
        if options.advantage_from == "engine":
            if logp_engine_B_T is None:
                raise ValueError("advantage_from='engine' needs logp_engine")
            baseline = logp_engine_B_T
        else:
            if logp_learner_B_T is None:
                raise ValueError("advantage_from='learner' needs logp_learner")
            baseline = logp_learner_B_T
        adv_B_T = (logp_teacher_B_T - baseline).detach()
    else:
        if reward_B is None or group_B is None:
            raise ValueError(f"loss {options.loss!r} needs a reward per response and its group")
        adv_B = rl_advantage(reward_B.to(mask.dtype), group_B, options.loss)
        adv_B_T = adv_B[:, None].expand_as(mask)
    if options.center_advantage:
        adv_B_T = adv_B_T - (adv_B_T * mask).sum() / mask.sum().clamp_min(1.0)
    return adv_B_T


def advantage_needs_learner(options: LossOptions) -> bool:
    """Whether A_t depends on the learner's own log-probabilities (the default OPD)."""
    return options.loss == "opd" and options.advantage_from == "learner"


def importance_weight(
    logp_learner_B_T: torch.Tensor, logp_engine_B_T: torch.Tensor | None, options: LossOptions
) -> torch.Tensor:
    """Truncated importance weight min(exp(logp_learner - logp_engine), C) (no gradient); 1
    when is_clip is 0."""
    if options.is_clip <= 0:
        return torch.ones_like(logp_learner_B_T)
    if logp_engine_B_T is None:
        raise ValueError("is_clip needs logp_engine")
    return torch.exp(logp_learner_B_T.detach() - logp_engine_B_T).clamp(max=options.is_clip)


def token_loss(
    logp_learner_B_T: torch.Tensor,
    adv_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    weight_B_T: torch.Tensor,
    tokens: float | torch.Tensor,
) -> torch.Tensor:
    """-(sum_t w_t A_t logp_learner_t) / tokens: `tokens` is the whole step's count, so the
    micro-batches' losses (and gradients) add up to the full batch's."""
    mask = mask_B_T.to(logp_learner_B_T.dtype)
    return -(weight_B_T * adv_B_T * logp_learner_B_T * mask).sum() / tokens


def policy_loss(
    logp_learner_B_T: torch.Tensor,
    logp_teacher_B_T: torch.Tensor | None,
    mask_B_T: torch.Tensor,
    logp_engine_B_T: torch.Tensor | None = None,
    options: LossOptions = LossOptions(),
    reward_B: torch.Tensor | None = None,
    group_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-(sum_t w_t A_t logp_learner_t) / tokens over one whole batch, and its statistics.

    A_t = sg(logp_teacher - logp_{learner|engine}) for "opd"; the per-response RL advantage
    of `reward_B` (grouped by `group_B`) for "reinforce" and "grpo"."""
    mask = mask_B_T.to(logp_learner_B_T.dtype)
    tokens = mask.sum().clamp_min(1.0)
    adv_B_T = advantage(
        logp_learner_B_T, logp_teacher_B_T, mask_B_T, logp_engine_B_T, options, reward_B, group_B
    )
    weight_B_T = importance_weight(logp_learner_B_T, logp_engine_B_T, options)
    loss = token_loss(logp_learner_B_T, adv_B_T, mask_B_T, weight_B_T, tokens)
    stats = {"loss": float(loss.detach())}
    if logp_teacher_B_T is not None:
        with torch.no_grad():
            reverse_kl = ((logp_learner_B_T - logp_teacher_B_T) * mask).sum() / tokens
        stats["train_kl"] = float(reverse_kl)
    return loss, stats
