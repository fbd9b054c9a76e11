"""The rollout batch: the one record that flows through every stage as an ObjectRef.

Arrays are numpy (zero-copy through Ray's object store); each stage fills in its own
logprob field. Names carry axes: B responses, P prompt tokens, T response tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RolloutBatch:
    """Responses sampled by one engine at one weights version, plus each stage's logprobs."""

    prompt_ids_B_P: np.ndarray
    """Prompt token ids, left-padded (int64)."""
    prompt_mask_B_P: np.ndarray
    """True on real prompt tokens."""
    response_ids_B_T: np.ndarray
    """Sampled token ids, right-padded (int64)."""
    response_mask_B_T: np.ndarray
    """True on response tokens (EOS included, padding after it excluded)."""
    logp_engine_B_T: np.ndarray
    """log q_c(y_t | s_t) of the distribution the engine actually sampled from (float32)."""
    version: int
    """Weights version the engine generated with."""
    prompt_index_B: np.ndarray
    """Row of each response's prompt in its dataset (int64); responses of a prompt are a group."""
    answers: list[str | None] = field(default_factory=list)
    """Reference answer per response, where the task has one."""
    recipe: str = "bf16"
    """Precision recipe of the engine that sampled."""
    logdist_engine_B_T_V: np.ndarray | None = None
    """The engine's full next-token log-distribution (small vocabularies only)."""
    logp_rescore_B_T: np.ndarray | None = None
    """log p_v(y_t | s_t): BF16 student at the same version v (Rescorer)."""
    kl_engine_exact_B_T: np.ndarray | None = None
    """Exact KL(q_c || p_v) over the vocabulary at each visited prefix (Rescorer)."""
    logp_teacher_B_T: np.ndarray | None = None
    """log p_T(y_t | s_t) (TeacherScorer)."""
    logdist_teacher_B_T_V: np.ndarray | None = None
    """Teacher full log-distribution, only when asked for (held-out KL)."""
    gen_seconds: float = 0.0
    """Wall seconds the engine spent generating this batch."""
    reward_B: np.ndarray | None = None
    """0/1 correctness of each response against its reference answer (GeneratorWorker), where
    the task has answers: the RL baselines' reward, and a training-accuracy metric for OPD."""

    @property
    def num_responses(self) -> int:
        return int(self.response_ids_B_T.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask_B_T.sum())

    def replace(self, **changes: object) -> RolloutBatch:
        return dataclasses.replace(self, **changes)

    def select(self, rows: np.ndarray | list[int]) -> RolloutBatch:
        """These rows, their padding trimmed to their own widest prompt and response.

        Prompts are left-padded and responses right-padded, and positions come from the
        attention mask, so trimming changes no token's position or score: a micro-batch
        computes on its own padded size, not the batch's."""
        rows = np.asarray(rows, dtype=np.int64)
        p_len = self.prompt_mask_B_P[rows].sum(1)
        t_len = self.response_mask_B_T[rows].sum(1)
        P = int(p_len.max()) if len(rows) else 0
        T = max(int(t_len.max()) if len(rows) else 0, 1)
        width_P = self.prompt_ids_B_P.shape[1]
        changes: dict[str, object] = {
            "answers": [self.answers[i] for i in rows] if self.answers else []
        }
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, np.ndarray):
                continue
            if f.name.endswith("_B_P"):
                changes[f.name] = value[rows, width_P - P :]
            elif "_B_T" in f.name:
                changes[f.name] = value[rows, :T]
            elif f.name.endswith("_B"):
                changes[f.name] = value[rows]
        return dataclasses.replace(self, **changes)

    def response_texts(self, decode) -> list[str]:
        """Decode each response's tokens (EOS and padding dropped) with `decode(ids) -> str`."""
        return [
            decode([int(t) for t, m in zip(ids, mask) if m])
            for ids, mask in zip(self.response_ids_B_T, self.response_mask_B_T)
        ]


def _pad_cat(arrays: list[np.ndarray], left: bool, fill: float | int | bool) -> np.ndarray:
    width = max(a.shape[1] for a in arrays)
    out = []
    for a in arrays:
        pad = [(0, 0)] * a.ndim
        pad[1] = (width - a.shape[1], 0) if left else (0, width - a.shape[1])
        out.append(np.pad(a, pad, constant_values=fill))
    return np.concatenate(out, axis=0)


def concat(batches: list[RolloutBatch]) -> RolloutBatch:
    """Join batches of the same version (re-padding to the widest)."""
    if len(batches) == 1:
        return batches[0]
    versions = {b.version for b in batches}
    if len(versions) != 1:
        raise ValueError(f"cannot concat batches of different versions {sorted(versions)}")
    first = batches[0]
    kw: dict[str, object] = {}
    for f in dataclasses.fields(RolloutBatch):
        values = [getattr(b, f.name) for b in batches]
        if f.name.startswith("prompt_ids"):
            kw[f.name] = _pad_cat(values, left=True, fill=0)
        elif f.name.startswith("prompt_mask"):
            kw[f.name] = _pad_cat(values, left=True, fill=False)
        elif f.name.endswith("_B") and all(v is not None for v in values):
            kw[f.name] = np.concatenate(values)
        elif f.name == "answers":
            kw[f.name] = [a for v in values for a in v]
        elif f.name == "gen_seconds":
            kw[f.name] = max(values)
        elif f.name in ("version", "recipe"):
            kw[f.name] = getattr(first, f.name)
        elif any(v is None for v in values):
            kw[f.name] = None
        else:
            fill = False if values[0].dtype == bool else 0
            kw[f.name] = _pad_cat(values, left=False, fill=fill)
    return RolloutBatch(**kw)  # type: ignore[arg-type]
