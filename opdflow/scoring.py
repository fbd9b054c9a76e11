"""Per-token log-probabilities of given responses under a model: one forward pass.

The rescorer, the teacher scorer, the learner and the evaluator all score tokens the
same way (prefill of prompt + response, logits shifted by one), so their numbers differ
only by the weights and precision they use, never by how they were computed.
"""

from __future__ import annotations

import numpy as np
import torch

from opdflow.rollout import RolloutBatch


def batch_tensors(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """input_ids_B_L, attention_mask_B_L, position_ids_B_L, and the prompt width P."""
    ids = torch.from_numpy(np.concatenate([batch.prompt_ids_B_P, batch.response_ids_B_T], 1)).long()
    attn = torch.from_numpy(
        np.concatenate([batch.prompt_mask_B_P, batch.response_mask_B_T], 1)
    ).long()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    return ids, attn, pos, batch.prompt_ids_B_P.shape[1]


def token_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    want_logdist: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp_B_T of each response token (float32, grad if enabled) and optionally logdist_B_T_V."""
    ids, attn, pos, P = batch_tensors(batch)
    T = batch.response_ids_B_T.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    logits_B_T_V = logits[:, P - 1 : P - 1 + T].float()
    if temperature != 1.0:
        logits_B_T_V = logits_B_T_V / temperature
    logdist_B_T_V = torch.log_softmax(logits_B_T_V, dim=-1)
    target = ids[:, P : P + T]
    logp_B_T = logdist_B_T_V.gather(-1, target[..., None]).squeeze(-1)
    mask = torch.tensor(batch.response_mask_B_T)
    logp_B_T = torch.where(mask, logp_B_T, torch.zeros_like(logp_B_T))
    return logp_B_T, (logdist_B_T_V if want_logdist else None)
