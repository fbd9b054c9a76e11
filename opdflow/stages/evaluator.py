"""The held-out evaluator: the standard BF16 engine samples from the current student on
a fixed prompt set; exact KL(p_student || p_teacher) over the vocabulary, per prompt.

The KL compares the engine's BF16 student and the teacher on a prefill of the sampled
responses, chunk by chunk (scoring.exact_kl_batch), so no B x T x V distribution is
ever stored: at temperature 1 and top-p 1 it is the distribution the engine sampled from.
Prompts are generated `eval.batch_prompts` at a time and the prefill runs in micro-batches
of the learner's token budget, so memory does not grow with the number of held-out prompts
(530 problems of 16k tokens would need ~0.5 TB of KV cache at once).

Responses always come from the standard engine, never the run's own recipe, so runs
with different rollout engines are compared on equal footing (the paper's metric).
`Evaluator` computes on its device with no Ray; `EvaluatorActor` wraps it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from opdflow.device import stage_device
from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.scoring import DEFAULT_CHUNK_TOKENS, exact_kl_batch
from opdflow.stages import StageActor, pin_threads
from opdflow.task import correctness


class Evaluator:
    """Standard BF16 student engine plus the teacher."""

    def __init__(
        self,
        student_path: str,
        teacher_path: str,
        tokenizer_path: str,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        micro_batch_tokens: int = 0,
        batch_prompts: int = 64,
        device: str | None = None,
    ):
        from opdflow.engines.torch_engine import TorchEngine
        from opdflow.models import load_model
        from opdflow.tokenizer import load_tokenizer

        self.device = stage_device(device)
        self.tok = load_tokenizer(tokenizer_path)
        self.engine = TorchEngine(
            student_path, self.tok.pad_token_id, self.tok.eos_token_id, "bf16", str(self.device)
        )
        self.teacher = load_model(teacher_path, "bfloat16", str(self.device))
        self.chunk_tokens = chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens
        self.batch_prompts = batch_prompts

    @property
    def version(self) -> int:
        return self.engine.version

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        self.engine.load_weights(state, version)

    @torch.no_grad()
    def heldout(
        self,
        prompt_ids: list[list[int]],
        answers: list,
        n: int,
        max_new_tokens: int,
        seed: int,
    ) -> dict:
        """Held-out KL and accuracy of the current weights: pooled, and per prompt.

        Prompts lo..lo+batch_prompts are sampled with seed + lo: the same responses on
        every evaluation of a run and across runs with the same eval settings."""
        P = len(prompt_ids)
        kl_sum_P, tok_P, acc_P = np.zeros(P), np.zeros(P, np.int64), np.zeros(P)
        for lo in range(0, P, self.batch_prompts):
            hi = min(lo + self.batch_prompts, P)
            req = GenerationRequest(
                prompt_ids[lo:hi], list(range(lo, hi)), answers[lo:hi], n, seed + lo,
                self.engine.version, SamplingParams(1.0, 1.0, max_new_tokens),
            )  # fmt: skip
            batch = self.engine.generate(req)
            kl_B_T = exact_kl_batch(
                self.engine.model, self.teacher, batch, self.micro_batch_tokens, self.chunk_tokens
            )
            mask = batch.response_mask_B_T
            kl_sum_P[lo:hi] = (kl_B_T * mask).sum(1).reshape(hi - lo, n).sum(1)
            tok_P[lo:hi] = mask.sum(1).reshape(hi - lo, n).sum(1)
            acc_P[lo:hi] = correctness(batch, self.tok).astype(float).reshape(hi - lo, n).mean(1)
        return {
            "version": self.engine.version,
            "kl": float(kl_sum_P.sum() / max(tok_P.sum(), 1)),
            "accuracy": float(acc_P.mean()),
            "kl_sum_P": kl_sum_P.tolist(),
            "tokens_P": tok_P.tolist(),
            "accuracy_P": acc_P.tolist(),
        }


class EvaluatorActor(StageActor):
    """The evaluator as a Ray actor: fetches the version to evaluate, records its span."""

    def __init__(self, student_path: str, teacher_path: str, tokenizer_path: str, threads: int,
                 *args: Any):  # fmt: skip
        pin_threads(threads)
        self.stage = Evaluator(student_path, teacher_path, tokenizer_path, *args)

    def heldout(
        self,
        version: int,
        weights_box: list,
        prompt_ids: list[list[int]],
        answers: list,
        n: int,
        max_new_tokens: int,
        seed: int,
    ) -> dict:
        stage = self.stage
        self.ensure_weights(
            version, stage.version, weights_box, -1, stage.load_weights, stage.device
        )
        with self.span("evaluator", -1, version) as s:
            out = stage.heldout(prompt_ids, answers, n, max_new_tokens, seed)
            s["tokens"] = int(sum(out["tokens_P"]))
        return out
