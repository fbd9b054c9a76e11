"""The held-out evaluator: the standard BF16 engine samples from the current student on
a fixed prompt set; exact KL(p_student || p_teacher) over the vocabulary, per prompt.

The KL compares the engine's BF16 student and the teacher on a prefill of the sampled
responses, chunk by chunk (scoring.exact_kl_batch), so no B x T x V distribution is
ever stored: at temperature 1 and top-p 1 it is the distribution the engine sampled from.
Prompts are generated `eval.batch_prompts` at a time and the prefill runs in micro-batches
of the learner's token budget, so memory does not grow with the number of held-out prompts
(530 problems of 16k tokens would need ~0.5 TB of KV cache at once).

Responses always come from the standard engine, never the run's own recipe, so runs
with different rollout engines are compared on equal footing (the paper's metric). That
engine is the run's engine kind at BF16: TorchEngine, or with engine.kind = "vllm" a BF16
VLLMEngine (vLLM's fast sampling), whose responses a BF16 transformers student then scores
(scoring stays in the training engine's code, the KL needs full distributions). Accuracy
grades each response with the run's grader (grader.py: "exact" or "math").
`Evaluator` computes on its device with no Ray; `EvaluatorActor` wraps it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from opdflow.compute.device import stage_device
from opdflow.compute.scoring import DEFAULT_CHUNK_TOKENS, exact_kl_batch
from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.stages.actor import StageActor, pin_threads
from opdflow.stages.specs import EvaluatorSpec
from opdflow.testbed.task import correctness, decoded_responses
from opdflow.weights.version import WeightsRef


class Evaluator:
    """Standard BF16 student engine (TorchEngine or vLLM) plus the teacher."""

    def __init__(
        self,
        student_path: str,
        teacher_path: str,
        tokenizer_path: str,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        micro_batch_tokens: int = 0,
        batch_prompts: int = 64,
        device: str | None = None,
        *,
        engine_kind: str = "torch",
        grader: str = "exact",
        grader_timeout_s: float = 5.0,
        vllm_gpu_memory_utilization: float = 0.4,
        keep_texts: bool = False,
        max_model_len: int | None = None,
    ):
        from opdflow.inputs.grader import make_grader
        from opdflow.inputs.models import load_model, load_tokenizer

        self.device = stage_device(device)
        self.tok = load_tokenizer(tokenizer_path)
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        if engine_kind == "vllm":  # vLLM first: on a GPU it sizes itself by the free memory
            from opdflow.engines.vllm_engine import VLLMEngine

            self.engine: Any = VLLMEngine(
                student_path, pad, eos, "bf16", max_model_len=max_model_len,
                gpu_memory_utilization=vllm_gpu_memory_utilization,
            )  # fmt: skip
            self.student = load_model(student_path, "bfloat16", str(self.device))
        else:
            from opdflow.engines.torch_engine import TorchEngine

            self.engine = TorchEngine(student_path, pad, eos, "bf16", str(self.device))
            self.student = self.engine.model  # the engine's own BF16 model scores
        self.engine_kind = engine_kind
        self.teacher = load_model(teacher_path, "bfloat16", str(self.device))
        self.chunk_tokens = chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens
        self.batch_prompts = batch_prompts
        self.grader = make_grader(grader, grader_timeout_s)
        self.keep_texts = keep_texts

    @property
    def version(self) -> int:
        return self.engine.version

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        self.engine.load_weights(state, version)
        if self.student is not getattr(self.engine, "model", None):
            self.student.load_state_dict(state, strict=True)

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
        every evaluation of a run and across runs with the same eval settings. With
        keep_texts the result also has "texts": (prompt index, response, answer, 0/1) rows."""
        P = len(prompt_ids)
        kl_sum_P, tok_P, acc_P = np.zeros(P), np.zeros(P, np.int64), np.zeros(P)
        kept: list[tuple[int, str, str | None, float]] = []
        for lo in range(0, P, self.batch_prompts):
            hi = min(lo + self.batch_prompts, P)
            req = GenerationRequest(
                prompt_ids[lo:hi], list(range(lo, hi)), answers[lo:hi], n, seed + lo,
                self.engine.version, SamplingParams(1.0, 1.0, max_new_tokens),
            )  # fmt: skip
            batch = self.engine.generate(req)
            kl_B_T = exact_kl_batch(
                self.student, self.teacher, batch, self.micro_batch_tokens, self.chunk_tokens
            )
            mask = batch.response_mask_B_T
            kl_sum_P[lo:hi] = (kl_B_T * mask).sum(1).reshape(hi - lo, n).sum(1)
            tok_P[lo:hi] = mask.sum(1).reshape(hi - lo, n).sum(1)
            texts = decoded_responses(batch, self.tok)
            right_B = correctness(batch, self.tok, self.grader, texts).astype(float)
            acc_P[lo:hi] = right_B.reshape(hi - lo, n).mean(1)
            if self.keep_texts:
                kept += [(int(i), t, a, float(r)) for i, t, a, r in
                         zip(batch.prompt_index_B, texts, batch.answers, right_B)]  # fmt: skip
        return {
            "version": self.engine.version,
            "kl": float(kl_sum_P.sum() / max(tok_P.sum(), 1)),
            "accuracy": float(acc_P.mean()),
            "kl_sum_P": kl_sum_P.tolist(),
            "tokens_P": tok_P.tolist(),
            "accuracy_P": acc_P.tolist(),
            **({"texts": kept} if self.keep_texts else {}),
        }


class EvaluatorActor(StageActor):
    """The evaluator as a Ray actor: fetches the version to evaluate, records its span."""

    def __init__(self, spec: EvaluatorSpec):
        pin_threads(spec.threads)
        self.stage = Evaluator(
            spec.student, spec.teacher, spec.tokenizer, spec.chunk_tokens,
            spec.micro_batch_tokens, spec.batch_prompts, **spec.evaluator_options(),
        )  # fmt: skip

    def engine_kind(self) -> str:
        """Which engine generates the held-out responses ("torch" or "vllm")."""
        return self.stage.engine_kind

    def heldout(
        self,
        weights: WeightsRef,
        prompt_ids: list[list[int]],
        answers: list,
        n: int,
        max_new_tokens: int,
        seed: int,
    ) -> dict:
        """Held-out evaluation of the student at `weights` (Evaluator.heldout)."""
        stage = self.stage
        self.ensure_weights(weights, stage.version, -1, stage.load_weights, stage.device)
        with self.span("evaluator", -1, weights.version) as s:
            out = stage.heldout(prompt_ids, answers, n, max_new_tokens, seed)
            s["tokens"] = int(sum(out["tokens_P"]))
        return out
