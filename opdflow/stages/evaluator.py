"""The held-out evaluator: the standard BF16 engine samples from the current student on
a fixed prompt set; exact KL(p_student || p_teacher) over the vocabulary, per prompt.

The KL compares the engine's BF16 student and the teacher on a prefill of the sampled
responses, chunk by chunk (scoring.exact_kl_between), so no B x T x V distribution is
ever stored: at temperature 1 and top-p 1 it is the distribution the engine sampled from.

Responses always come from the standard engine, never the run's own recipe, so runs
with different rollout engines are compared on equal footing (the paper's metric).
"""

from __future__ import annotations

import torch

from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.engines.torch_engine import TorchEngine
from opdflow.scoring import DEFAULT_CHUNK_TOKENS, exact_kl_between
from opdflow.stages import StageActor, pin_threads
from opdflow.task import correctness


class Evaluator(StageActor):
    """Standard BF16 student engine plus the teacher (a Ray actor)."""

    def __init__(
        self,
        student_path: str,
        teacher_path: str,
        tokenizer_path: str,
        threads: int,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ):
        from opdflow.models import load_model
        from opdflow.tokenizer import load_tokenizer

        pin_threads(threads)
        self.tok = load_tokenizer(tokenizer_path)
        self.engine = TorchEngine(
            student_path, self.tok.pad_token_id, self.tok.eos_token_id, "bf16"
        )
        self.teacher = load_model(teacher_path, "bfloat16")
        self.chunk_tokens = chunk_tokens

    @torch.no_grad()
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
        self.ensure_weights(version, self.engine.version, weights_box, -1, self.engine.load_weights)
        with self.span("evaluator", -1, version) as s:
            out = self._heldout(version, prompt_ids, answers, n, max_new_tokens, seed)
            s["tokens"] = int(sum(out["tokens_P"]))
        return out

    def _heldout(
        self,
        version: int,
        prompt_ids: list[list[int]],
        answers: list,
        n: int,
        max_new_tokens: int,
        seed: int,
    ) -> dict:
        req = GenerationRequest(
            prompt_ids,
            list(range(len(prompt_ids))),
            answers,
            n,
            seed,
            version,
            SamplingParams(1.0, 1.0, max_new_tokens),
        )
        batch = self.engine.generate(req)
        kl_B_T = exact_kl_between(self.engine.model, self.teacher, batch, self.chunk_tokens)
        kl_B_T = kl_B_T.numpy()
        mask = batch.response_mask_B_T
        kl_sum_B = (kl_B_T * mask).sum(1)
        tok_B = mask.sum(1)
        correct_B = correctness(batch, self.tok).astype(float)
        P = len(prompt_ids)
        kl_sum_P = kl_sum_B.reshape(P, n).sum(1)
        tok_P = tok_B.reshape(P, n).sum(1)
        return {
            "version": version,
            "kl": float(kl_sum_P.sum() / max(tok_P.sum(), 1)),
            "accuracy": float(correct_B.mean()),
            "kl_sum_P": kl_sum_P.tolist(),
            "tokens_P": tok_P.tolist(),
            "accuracy_P": correct_B.reshape(P, n).mean(1).tolist(),
        }
