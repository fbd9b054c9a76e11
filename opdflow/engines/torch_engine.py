"""TorchEngine: batched sampling with a KV cache on a transformers causal LM.

The embedded default rollout engine: BF16 weights, computed in bfloat16 where the device
has native bf16 (GPUs, AVX512/AMX CPUs) and in float32 elsewhere (models.bf16_compute_dtype).
It reports the log-probability of each sampled token under the distribution it actually
sampled from (temperature and top-p applied), and on request the whole
next-token log-distribution so mismatch can be measured exactly on small vocabularies.
Precision recipes act through weight transforms, hooks and the KV cache it builds.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import numpy as np
import torch

from opdflow.core.recipe import Recipe, parse_recipe
from opdflow.core.rollout import RolloutBatch
from opdflow.engines import quantize
from opdflow.engines.base import GenerationRequest, SamplingParams


def sampling_logdist(logits_B_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-distribution actually sampled from: temperature, then top-p renormalised."""
    logits = logits_B_V.float() / params.temperature
    logdist = torch.log_softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_lp, order = logdist.sort(dim=-1, descending=True)
        mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logdist = torch.log_softmax(logits.masked_fill(drop, float("-inf")), dim=-1)
    return logdist


class TorchEngine:
    """A rollout engine on a transformers model; `recipe` sets its precision configuration."""

    def __init__(
        self,
        model_path: str,
        pad_id: int,
        eos_id: int,
        recipe: str | Recipe = "bf16",
        device: str = "cpu",
    ):
        from opdflow.inputs.models import load_model

        self.recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
        self.model = load_model(model_path, "bfloat16", device)
        self.compute_dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.pad_id, self.eos_id, self.device = pad_id, eos_id, device
        self.version = 0
        # transformers 5.2x renamed the forward's `past_key_values` to `cache`
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # the prefill needs the last position's logits only, not P x vocabulary of them
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        quantize.prepare(self.recipe, self.model)
        quantize.transform_weights(self.recipe, self.model)

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy a weights version in place (zero-copy views in: the only copy), then re-apply
        the recipe's weight transform."""
        from opdflow.weights.loader import load_module

        load_module(self.model, state)
        quantize.transform_weights(self.recipe, self.model)
        self.version = version

    @torch.no_grad()
    def generate(self, request: GenerationRequest) -> RolloutBatch:
        t0 = time.perf_counter()
        params = request.params
        n = request.n
        width = max(len(p) for p in request.prompt_ids)
        prompt_ids = np.full((len(request.prompt_ids), width), self.pad_id, dtype=np.int64)
        prompt_mask = np.zeros_like(prompt_ids, dtype=bool)
        for i, p in enumerate(request.prompt_ids):
            prompt_ids[i, width - len(p) :] = p
            prompt_mask[i, width - len(p) :] = True
        prompt_ids = np.repeat(prompt_ids, n, axis=0)
        prompt_mask = np.repeat(prompt_mask, n, axis=0)
        B = prompt_ids.shape[0]

        gen = torch.Generator(device=self.device).manual_seed(request.seed)
        ids = torch.from_numpy(prompt_ids).to(self.device)
        attn = torch.from_numpy(prompt_mask).long().to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        from opdflow.engines.kvcache import make_cache  # transformers: loaded on first use

        cache = make_cache(self.recipe, self.model.config)
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            **{self._cache_kw: cache},
            **self._keep_last,
        )
        tokens, logps, masks, logdists = [], [], [], []
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        next_pos = pos[:, -1:]
        for _ in range(params.max_new_tokens):
            logdist_B_V = sampling_logdist(out.logits[:, -1], params)
            tok = torch.multinomial(logdist_B_V.exp(), 1, generator=gen).squeeze(-1)
            live = ~done
            tok = torch.where(live, tok, torch.full_like(tok, self.pad_id))
            tokens.append(tok)
            logps.append(torch.where(live, logdist_B_V.gather(-1, tok[:, None]).squeeze(-1), 0.0))
            masks.append(live)
            if params.return_logdist:
                logdists.append(logdist_B_V)
            done = done | (tok == self.eos_id)
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
            next_pos = next_pos + 1
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
        logdist = torch.stack(logdists, 1).cpu().numpy() if logdists else None
        return RolloutBatch(
            prompt_ids_B_P=prompt_ids,
            prompt_mask_B_P=prompt_mask,
            response_ids_B_T=torch.stack(tokens, 1).cpu().numpy(),
            response_mask_B_T=torch.stack(masks, 1).cpu().numpy(),
            logp_engine_B_T=torch.stack(logps, 1).float().cpu().numpy(),
            version=self.version,
            prompt_index_B=np.repeat(np.asarray(request.prompt_index, dtype=np.int64), n),
            answers=[a for a in request.answers for _ in range(n)],
            recipe=self.recipe.text,
            logdist_engine_B_T_V=logdist,
            gen_seconds=time.perf_counter() - t0,
        )
