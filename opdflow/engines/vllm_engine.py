"""VLLMEngine: the production rollout engine, vLLM behind the TorchEngine interface.

Same contract as TorchEngine: token ids plus the log-probability of each sampled token
under the distribution actually sampled from (vLLM's `processed_logprobs`: after
temperature and top-p), the full next-token log-distribution on request (small
vocabularies), and weights updated in place from the object store through a vLLM worker
extension (`reload_weights`), so a new version costs milliseconds, not an engine restart.

Inside a Ray actor vLLM runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0 with the
"uni" executor): its own worker process dies under Ray at the first generate. Only this
module imports vllm (`pip install opdflow[vllm]`).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import numpy as np

from opdflow.config import ConfigError
from opdflow.engines.base import GenerationRequest
from opdflow.rollout import RolloutBatch

VLLM_RECIPES = ("bf16", "fp8", "fp8_kv")
"""Recipes VLLMEngine maps to vLLM options (see vllm_options)."""
MAX_LOGDIST_VOCAB = 4096
"""Full log-distributions are returned (as top-V logprobs) only up to this vocabulary."""

_CALL = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:\((.*)\))?\s*$")


def vllm_options(recipe: str) -> dict[str, Any]:
    """vLLM engine options of a precision recipe (to move into engines/recipes.py).

    bf16: none. fp8: weights and activations E4M3 (`quantization="fp8"`, GPU only).
    fp8_kv: KV cache E4M3 (`kv_cache_dtype="fp8"`); `fp8_kv(skip=0)` keeps layer 0's KV
    cache in BF16 (`kv_cache_dtype_skip_layers`), several as `skip=0+2`.
    """
    m = _CALL.match(recipe or "")
    if not m or m.group(1) not in VLLM_RECIPES:
        raise ConfigError(
            f"engine.recipe = {recipe!r} is not supported by engine.kind='vllm': expected one "
            f"of {', '.join(VLLM_RECIPES)} (other recipes run on engine.kind='torch')"
        )
    name, argtext = m.group(1), (m.group(2) or "").strip()
    args = dict(p.split("=", 1) for p in (a.replace(" ", "") for a in argtext.split(",")) if p)
    unknown = set(args) - ({"skip"} if name == "fp8_kv" else set())
    if unknown or (argtext and not args):
        raise ConfigError(
            f"engine.recipe = {recipe!r}: unexpected arguments {sorted(unknown) or argtext!r}"
            + (" (fp8_kv takes skip=LAYER[+LAYER...])" if name == "fp8_kv" else "")
        )
    if name == "fp8":
        return {"quantization": "fp8"}
    if name == "fp8_kv":
        opts: dict[str, Any] = {"kv_cache_dtype": "fp8"}
        if "skip" in args:
            opts["kv_cache_dtype_skip_layers"] = args["skip"].split("+")
        return opts
    return {}


class WeightReloadExtension:
    """Mixed into vLLM's worker (worker_extension_cls): in-place weight reload by name."""

    def opdflow_reload(self, named_tensors: list[tuple[str, Any]]) -> None:
        self.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)  # type: ignore[attr-defined]


class VLLMEngine:
    """A rollout engine on vLLM; `recipe` maps to vLLM's quantization / KV-cache options."""

    def __init__(
        self,
        model_path: str,
        pad_id: int,
        eos_id: int,
        recipe: str = "bf16",
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        seed: int = 0,
    ):
        options = vllm_options(recipe)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; CPU build only
        from transformers import AutoConfig
        from vllm import LLM

        hf = AutoConfig.from_pretrained(model_path)
        self.vocab_size = int(hf.vocab_size)
        self.pad_id, self.eos_id, self.recipe = pad_id, eos_id, recipe
        self.version = 0
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,  # token ids in and out; the tokenizer lives elsewhere
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,  # torch.compile adds ~20 s of startup on CPU
            distributed_executor_backend="uni",
            worker_extension_cls=f"{__name__}.WeightReloadExtension",
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, self.vocab_size if self.vocab_size <= MAX_LOGDIST_VOCAB else 0),
            max_model_len=max_model_len or getattr(hf, "max_position_embeddings", None),
            enable_prefix_caching=False,
            **options,
        )

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy a weights version into the running engine (no restart, no new KV cache)."""
        self.llm.collective_rpc("opdflow_reload", args=(list(state.items()),))
        self.version = version

    def generate(self, request: GenerationRequest) -> RolloutBatch:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        p, n = request.params, request.n
        full = p.return_logdist and self.vocab_size <= MAX_LOGDIST_VOCAB
        sp = VSamplingParams(
            n=n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=0,
            max_tokens=p.max_new_tokens,
            seed=request.seed,
            logprobs=self.vocab_size if full else 0,
            stop_token_ids=[self.eos_id],
            detokenize=False,
        )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(ids)) for ids in request.prompt_ids],
            sp,
            use_tqdm=False,
        )
        width = max(len(ids) for ids in request.prompt_ids)
        B, T = len(request.prompt_ids) * n, p.max_new_tokens
        prompt_ids = np.full((B, width), self.pad_id, dtype=np.int64)
        prompt_mask = np.zeros((B, width), dtype=bool)
        resp = np.full((B, T), self.pad_id, dtype=np.int64)
        resp_mask = np.zeros((B, T), dtype=bool)
        logp = np.zeros((B, T), dtype=np.float32)
        logdist = np.full((B, T, self.vocab_size), -np.inf, dtype=np.float32) if full else None
        for i, (ids, out) in enumerate(zip(request.prompt_ids, outs)):
            completions = sorted(out.outputs, key=lambda c: c.index)
            for j, c in enumerate(completions):
                b = i * n + j
                prompt_ids[b, width - len(ids) :] = ids
                prompt_mask[b, width - len(ids) :] = True
                toks = list(c.token_ids)
                resp[b, : len(toks)] = toks
                resp_mask[b, : len(toks)] = True
                for t, (tok, lp) in enumerate(zip(toks, c.logprobs)):
                    logp[b, t] = lp[tok].logprob
                    if logdist is not None:
                        for v, entry in lp.items():
                            logdist[b, t, v] = entry.logprob
        T_used = max(1, int(resp_mask.sum(1).max()))
        return RolloutBatch(
            prompt_ids_B_P=prompt_ids,
            prompt_mask_B_P=prompt_mask,
            response_ids_B_T=resp[:, :T_used],
            response_mask_B_T=resp_mask[:, :T_used],
            logp_engine_B_T=logp[:, :T_used],
            version=self.version,
            prompt_index_B=np.repeat(np.asarray(request.prompt_index, dtype=np.int64), n),
            answers=[a for a in request.answers for _ in range(n)],
            recipe=self.recipe,
            logdist_engine_B_T_V=None if logdist is None else logdist[:, :T_used],
            gen_seconds=time.perf_counter() - t0,
        )
