"""Measuring a recipe's mismatch without training: generate with it, rescore in BF16.

The recipe's engine samples responses to a fixed prompt set (the pipeline's held-out
prompts) at the student's weights; the BF16 student rescores the very same tokens. D is
token-pooled nats/token: k1 = mean(logp_engine - logp_bf16), k3, and the exact
full-vocabulary KL(q_engine || p_bf16) at the visited prefixes when the vocabulary is small.
Every recipe samples with the same seed (common random numbers), so differences between
recipes are not sampling noise of the prompts. In-process: no Ray, no training.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from opdflow.config import PipelineConfig


@dataclass(frozen=True)
class Measurement:
    """One recipe's mismatch against the BF16 student on a fixed prompt set."""

    recipe: str
    d_k1: float
    """nats/token, token-pooled: mean(logp_engine - logp_bf16)."""
    d_k3: float
    """nats/token, token-pooled k3 = exp(-r) - 1 + r."""
    d_exact: float
    """Exact full-vocab KL(q_engine || p_bf16) at visited prefixes (nan if the vocab is too big)."""
    ci_low: float
    """95% bootstrap interval over prompts of d_k1 (opdflow.core.stats.pooled_ratio_ci)."""
    ci_high: float
    tokens: int
    prompts: int
    responses_per_prompt: int
    seconds: float
    sum_k1_P: tuple[float, ...]
    """Per-prompt sums of logp_engine - logp_bf16, for later statistics."""
    tokens_P: tuple[int, ...]
    """Per-prompt response token counts."""

    @property
    def d(self) -> float:
        """The best available estimate: exact KL where computed, else k1."""
        return self.d_exact if math.isfinite(self.d_exact) else self.d_k1

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["sum_k1_P"], row["tokens_P"] = list(self.sum_k1_P), list(self.tokens_P)
        return row


class MeasureSession:
    """The BF16 student, tokenizer and prompts of one pipeline, loaded once for many recipes."""

    def __init__(
        self,
        cfg: PipelineConfig,
        num_prompts: int = 16,
        responses_per_prompt: int = 2,
        seed: int = 0,
        weights: dict | None = None,
        log: Callable[[str], None] | None = None,
    ):
        from opdflow.inputs.data import load_prompts
        from opdflow.inputs.models import load_model, load_tokenizer, resolve_models

        self.cfg, self.seed, self.weights = cfg, seed, weights
        self.n = responses_per_prompt
        self.log = log or (lambda _msg: None)
        self.paths = resolve_models(cfg, log=self.log)
        self.tokenizer = load_tokenizer(self.paths.tokenizer)
        self.prompts = load_prompts(
            self.paths.heldout, self.tokenizer, cfg.data.max_prompt_tokens, limit=num_prompts
        )
        from opdflow.compute.device import stage_device

        self.device = str(stage_device())  # a GPU where this process has one
        self.student = load_model(self.paths.student, "bfloat16", self.device)
        if weights is not None:
            self.student.load_state_dict(weights, strict=True)
        self.num_layers = int(self.student.config.num_hidden_layers)
        self.exact = self.student.config.vocab_size <= cfg.engine.exact_kl_max_vocab

    def _engine(self, recipe: str):
        if self.cfg.engine.kind == "vllm":
            from opdflow.engines.vllm_engine import VLLMEngine as engine_cls
        else:
            from opdflow.engines.torch_engine import TorchEngine as engine_cls
        tok = self.tokenizer
        kwargs = {} if self.cfg.engine.kind == "vllm" else {"device": self.device}
        engine = engine_cls(
            self.paths.student,
            pad_id=tok.pad_token_id,
            eos_id=tok.eos_token_id,
            recipe=recipe,
            **kwargs,
        )
        if self.weights is not None:
            engine.load_weights(self.weights, 0)
        return engine

    def measure(self, recipe: str) -> Measurement:
        """Generate with `recipe`, rescore with the BF16 student, pool per prompt."""
        from opdflow.compute.scoring import score_batch
        from opdflow.core.mismatch import MismatchStats
        from opdflow.core.recipe import parse_recipe
        from opdflow.core.stats import pooled_ratio_ci
        from opdflow.engines.base import GenerationRequest, SamplingParams

        text = parse_recipe(recipe).text
        t0 = time.perf_counter()
        e = self.cfg.engine
        params = SamplingParams(e.temperature, e.top_p, e.max_new_tokens, self.exact)
        p = self.prompts
        request = GenerationRequest(
            p.token_ids, list(range(len(p))), p.answers, self.n, self.seed, 0, params
        )
        batch = self._engine(text).generate(request)
        if not self.exact:
            batch = batch.replace(logdist_engine_B_T_V=None)
        t = self.cfg.train
        scores = score_batch(
            self.student, batch, t.micro_batch_tokens, e.temperature, t.logit_chunk_tokens
        )
        logp_bf16, kl = scores.logp_B_T, scores.kl_B_T
        mask = batch.response_mask_B_T
        stats = MismatchStats.of(batch.logp_engine_B_T, logp_bf16, mask, kl)
        diff = np.where(mask, batch.logp_engine_B_T.astype(np.float64) - logp_bf16, 0.0)
        sums_P = np.bincount(batch.prompt_index_B, diff.sum(1), minlength=len(p))
        tokens_P = np.bincount(batch.prompt_index_B, mask.sum(1), minlength=len(p))
        ci = pooled_ratio_ci(sums_P, tokens_P, seed=self.seed)
        m = Measurement(
            recipe=text,
            d_k1=stats.k1,
            d_k3=stats.k3,
            d_exact=stats.exact,
            ci_low=ci.low,
            ci_high=ci.high,
            tokens=stats.tokens,
            prompts=len(p),
            responses_per_prompt=self.n,
            seconds=time.perf_counter() - t0,
            sum_k1_P=tuple(float(x) for x in sums_P),
            tokens_P=tuple(int(x) for x in tokens_P),
        )
        self.log(f"{text}: D k1 {m.d_k1:.3g} exact {m.d_exact:.3g} ({m.seconds:.1f} s)")
        return m


def measure_recipes(
    cfg: PipelineConfig,
    recipes: list[str],
    num_prompts: int = 16,
    responses_per_prompt: int = 2,
    seed: int = 0,
    weights: dict | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Mismatch of each recipe against the BF16 student, in the order given."""
    from opdflow.core.recipe import parse_recipe

    for r in recipes:
        parse_recipe(r)  # fail on a bad name before loading anything
    session = MeasureSession(cfg, num_prompts, responses_per_prompt, seed, weights, on_progress)
    return [session.measure(r) for r in recipes]


def write_measurements(measurements: list[Measurement], path: str) -> None:
    """Write rows as parquet (.parquet) or JSON (anything else)."""
    import json
    from pathlib import Path

    rows = [m.to_row() for m in measurements]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        out.write_text(json.dumps(rows, indent=2))
