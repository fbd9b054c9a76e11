"""VLLMEngine: the production rollout engine, vLLM behind the TorchEngine interface.

Same contract as TorchEngine: token ids plus the log-probability of each sampled token
under the distribution actually sampled from (vLLM's `processed_logprobs`: after
temperature and top-p), the full next-token log-distribution on request (small
vocabularies), and weights updated in place through a vLLM worker extension
(vllm_worker.py: `reload_weights`, from zero-copy views of the object-store buffer, or of
the buckets each worker receives on its own collective pair with the learner; each
tensor-parallel worker keeps its shard), so a new version costs milliseconds, not an
engine restart. A tensor-parallel engine's workers are processes vLLM spawned, not Ray
workers: an object-store version reaches them through one shared-memory copy the engine
makes (weights/segment.py), never pickled to each of them.
The same extension gives `fp8_kv` the emulation's KV scales (amax of each prefill, see
recipes.py), which vLLM has no option for; `fp8_kv(scale=unit)` is vLLM's own FP8 cache.
The `LLM(...)` arguments (a recipe's options, the throughput settings for this machine)
come from vllm_settings.py, the version floor from vllm_version.py. Only this module
imports vllm (`pip install opdflow[vllm]`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from opdflow.core.rollout import RolloutBatch
from opdflow.engines.base import GenerationRequest
from opdflow.engines.recipes import vllm_options
from opdflow.engines.vllm_settings import (
    context_length,
    cpu_thread_binding,
    engine_options,
    runtime_options,
)
from opdflow.engines.vllm_worker import WorkerExtension

MAX_LOGDIST_VOCAB = 4096
"""Full log-distributions are returned (as top-V logprobs) only up to this vocabulary."""


def on_gpu() -> bool:
    """Whether vLLM runs on a CUDA GPU here (not its CPU build)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


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
        enforce_eager: bool | None = None,
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enable_prefix_caching: bool | None = None,
    ):
        """enforce_eager / enable_prefix_caching None: decided by runtime_options.
        max_model_len: the longest prompt + response the run asks for (capped at the model's
        context), so vLLM plans its KV cache for the run's sequences, not the model's
        longest (131k tokens for DeepSeek-R1-Distill-Qwen)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; CPU build only
        if tensor_parallel_size > 1:  # forked workers die under Ray: spawn them
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from transformers import AutoConfig
        from vllm import LLM

        hf = AutoConfig.from_pretrained(model_path)
        options = engine_options(recipe, int(hf.num_hidden_layers))
        self.kv_amax = vllm_options(recipe, int(hf.num_hidden_layers))["kv_cache_scale"] == "amax"
        gpu = on_gpu()
        if tensor_parallel_size > 1 and not gpu:
            os.environ.setdefault(
                "VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tensor_parallel_size)
            )
        self.options = runtime_options(
            self.kv_amax, tensor_parallel_size, gpu, enforce_eager, enable_prefix_caching
        )
        if gpu:
            self.options["gpu_memory_utilization"] = gpu_memory_utilization
        self.vocab_size = int(hf.vocab_size)
        self.pad_id, self.eos_id, self.recipe = pad_id, eos_id, recipe
        self.version = 0
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,  # token ids in and out; the tokenizer lives elsewhere
            dtype=dtype,
            seed=seed,
            worker_extension_cls=f"{WorkerExtension.__module__}.{WorkerExtension.__qualname__}",
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, self.vocab_size if self.vocab_size <= MAX_LOGDIST_VOCAB else 0),
            max_model_len=context_length(
                max_model_len, getattr(hf, "max_position_embeddings", None)
            ),
            **self.options,
            **options,
        )
        if self.kv_amax:
            self.llm.collective_rpc("opdflow_install_kv_amax")

    def load_weights(self, state: dict[str, Any], version: int) -> None:
        """Copy a weights version into the running engine (no restart, no new KV cache) and
        drop the prefix cache: its blocks hold keys and values of the old weights.

        In-process workers (one GPU, or the CPU build's "uni" executor) reload from the
        views themselves; spawned tensor-parallel workers map one shared copy of the
        version and each load their shard (weights/segment.py)."""
        if self.options["distributed_executor_backend"] == "mp":
            from opdflow.weights.segment import share

            self._segment, specs = share(state, getattr(self, "_segment", None))
            seg = self._segment
            self.llm.collective_rpc("opdflow_reload_shared", args=(seg.path, specs, seg.nbytes))
            seg.unlink()  # every worker has mapped it: the memory lives as long as they do
        else:
            self.llm.collective_rpc("opdflow_reload", args=(list(state.items()),))
        self._loaded(version)

    def _loaded(self, version: int) -> None:
        if self.options["enable_prefix_caching"]:
            self.llm.reset_prefix_cache()
        self.version = version

    # A collective weights version is received by each vLLM worker on its own pair with the
    # learner (fetcher.Receiver), bucket by bucket on its device, each tensor handed to
    # vLLM's reload path once whole (each tensor-parallel worker keeps its shard), each
    # bucket freed once loaded: vLLM has taken most of the GPU for its KV cache.

    def pair_owners(self) -> list[str]:
        return list(self.llm.collective_rpc("opdflow_pair_owner"))

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        from opdflow.weights.pair import node_ip

        by_owner = dict(zip(self.pair_owners(), keys))
        self.llm.collective_rpc(
            "opdflow_join", args=(address, by_owner, backend, timeout_s, node_ip())
        )

    def receive(self, version: int, specs: tuple, nbytes: int, bucket_bytes: int) -> None:
        self.llm.collective_rpc("opdflow_receive", args=(version, specs, nbytes, bucket_bytes))
        self._loaded(version)

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
        if self.kv_amax:
            self.llm.collective_rpc("opdflow_arm_kv_amax")
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
