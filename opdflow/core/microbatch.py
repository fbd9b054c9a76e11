"""Micro-batches: a step's responses packed into groups of at most a token budget.

The memory of a forward (and of its backward) grows with the padded tokens it sees: rows x
(widest prompt + widest response). Every stage that runs a model over a batch (learner,
rescorer, teacher, the evaluator's prefill) runs it as micro-batches of at most
`budget` padded tokens, so memory is set by the budget, never by the batch: 64 responses
of 16k tokens cost what one micro-batch costs. Rows are packed longest first, so rows of
similar length share a micro-batch and little compute goes to padding.

A data-parallel learner deals the micro-batches to its ranks round robin; every rank must
run the same number of forwards and backwards (FSDP's collectives pair them up), so a rank
short of work runs a placeholder (`None`) that contributes nothing.
"""

from __future__ import annotations

import numpy as np


def plan(
    prompt_len_B: np.ndarray, response_len_B: np.ndarray, budget: int, parts: int = 1
) -> list[np.ndarray]:
    """Row indices of each micro-batch, longest rows first.

    A micro-batch holds rows while rows x (widest prompt + widest response) <= budget; a row
    longer than the budget goes alone. budget 0: one micro-batch of every row. At least
    `parts` micro-batches are made when there are that many rows (each rank gets real work).
    """
    prompt_len_B = np.asarray(prompt_len_B, dtype=np.int64)
    response_len_B = np.asarray(response_len_B, dtype=np.int64)
    B = len(prompt_len_B)
    if B == 0:
        return []
    order = np.argsort(-(prompt_len_B + response_len_B), kind="stable")
    groups: list[list[int]] = []
    if budget <= 0:
        groups = [order.tolist()]
    else:
        current: list[int] = []
        widest_p = widest_t = 0
        for row in order.tolist():
            p = max(widest_p, int(prompt_len_B[row]))
            t = max(widest_t, int(response_len_B[row]))
            if current and (len(current) + 1) * (p + t) > budget:
                groups.append(current)
                current, p, t = [], int(prompt_len_B[row]), int(response_len_B[row])
            current.append(row)
            widest_p, widest_t = p, t
        groups.append(current)
    while len(groups) < min(parts, B):  # split the fullest micro-batch until each rank has one
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        half = (len(groups[i]) + 1) // 2
        groups[i : i + 1] = [groups[i][:half], groups[i][half:]]
    return [np.asarray(g, dtype=np.int64) for g in groups]


def deal(micro_batches: list[np.ndarray], ranks: int) -> list[list[np.ndarray | None]]:
    """Micro-batch i to rank i % ranks; every rank gets the same count, `None` filling in."""
    per_rank = -(-len(micro_batches) // ranks) if micro_batches else 0
    out: list[list[np.ndarray | None]] = [[] for _ in range(ranks)]
    for i, rows in enumerate(micro_batches):
        out[i % ranks].append(rows)
    for mine in out:
        mine.extend([None] * (per_rank - len(mine)))
    return out


def of_batch(batch, budget: int, parts: int = 1) -> list[np.ndarray]:
    """`plan` for a RolloutBatch, from its prompt and response masks."""
    return plan(batch.prompt_mask_B_P.sum(1), batch.response_mask_B_T.sum(1), budget, parts)
