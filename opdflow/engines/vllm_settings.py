"""The `LLM(...)` arguments VLLMEngine starts vLLM with, decided without importing vllm.

A recipe's options (engine_options: quantization, KV-cache dtype and its BF16 escape
layers, from recipes.vllm_options; what vLLM cannot run from a BF16 checkpoint is refused)
and the throughput settings (runtime_options): CUDA graphs on GPUs (eager on vLLM's CPU
build, where compiling adds ~20 s of startup for nothing), prefix caching on (a step
samples each prompt responses_per_prompt times: the prompt's KV cache is computed once; the
engine resets the cache at every weights update, as cached blocks belong to the old
weights), and `tensor_parallel_size` GPUs per replica. Inside a Ray actor vLLM runs
in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0 with the "uni" executor): its own worker
process dies under Ray at the first generate. A tensor-parallel replica needs one worker
per GPU: vLLM's "mp" executor with spawned workers (VLLM_WORKER_MULTIPROC_METHOD=spawn),
each on one of the GPUs Ray gave the actor; on the CPU build, each on its own cores
(cpu_thread_binding).
"""

from __future__ import annotations

import os
from typing import Any

from opdflow.engines.recipes import vllm_options
from opdflow.errors import ConfigError


def engine_options(recipe: str, num_layers: int) -> dict[str, Any]:
    """vLLM `LLM(...)` arguments of a recipe, from recipes.vllm_options (the one mapping).

    fp8 -> quantization="fp8" (GPU only); fp8_kv -> kv_cache_dtype="fp8", with BF16 KV escapes
    as kv_cache_dtype_skip_layers (its amax scales come from VLLMEngine's worker extension,
    not from an option). What vLLM cannot run from a BF16 checkpoint as stated (noise,
    nvfp4, keys/values-only KV, skipped fp8 layers) is refused, naming the field.
    """
    o = vllm_options(recipe, num_layers)
    why = (
        "a weight transform (noise)" if o["weight_transform"]
        else "NVFP4 (needs a Model Optimizer checkpoint)" if o["quantization"] == "modelopt_fp4"
        else "keys- or values-only KV quantization" if not o["exact"]
        else "BF16 escape layers for fp8 weights" if o["ignored_layers"]
        else None
    )  # fmt: skip
    if why:
        raise ConfigError(
            f"engine.recipe = {recipe!r} is not supported by engine.kind='vllm': {why}; "
            "run it with engine.kind='torch'"
        )
    out: dict[str, Any] = {}
    if o["quantization"]:
        out["quantization"] = o["quantization"]
    if o["kv_cache_dtype"] != "auto":
        out["kv_cache_dtype"] = o["kv_cache_dtype"]
    if o["kv_cache_bf16_layers"]:
        out["kv_cache_dtype_skip_layers"] = [str(i) for i in o["kv_cache_bf16_layers"]]
    return out


def runtime_options(
    kv_amax: bool,
    tensor_parallel_size: int,
    gpu: bool,
    enforce_eager: bool | None = None,
    enable_prefix_caching: bool | None = None,
) -> dict[str, Any]:
    """The `LLM(...)` arguments that decide throughput, resolved for this machine.

    CUDA graphs (enforce_eager=False) on GPUs, eager on the CPU build; prefix caching on;
    a tensor-parallel replica gets vLLM's multiprocessing executor (one worker per GPU),
    one GPU or the CPU build the in-process "uni" executor. The fp8_kv amax rule sets its
    KV scales from each generation's prefill through forward hooks, so it runs eager (the
    hooks do not run inside a CUDA graph) and without prefix caching (a block cached under
    an earlier generation's scales would be read with this one's)."""
    if kv_amax and enforce_eager is False:
        raise ConfigError(
            "engine.recipe = 'fp8_kv' on vLLM sets FP8 KV scales from each prefill "
            "through forward hooks, which need eager mode; use fp8_kv(scale=unit) for an "
            "engine with CUDA graphs"
        )
    eager = (not gpu or kv_amax) if enforce_eager is None else enforce_eager
    caching = (not kv_amax) if enable_prefix_caching is None else enable_prefix_caching
    return {
        "enforce_eager": eager,
        "enable_prefix_caching": caching,
        "tensor_parallel_size": tensor_parallel_size,
        "distributed_executor_backend": "mp" if tensor_parallel_size > 1 else "uni",
    }


def cpu_thread_binding(tensor_parallel_size: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a tensor-parallel replica on vLLM's CPU build: this
    process's cores split into one group per rank ("0|1", "0,1,2,3|4,5,6,7"). vLLM's own
    default binds one NUMA node per rank and refuses machines with fewer nodes than ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < tensor_parallel_size:
        raise ConfigError(
            f"engine.tensor_parallel_size = {tensor_parallel_size} on vLLM's CPU build needs a "
            f"core per rank; this process may use {len(cpus)}"
        )
    per = len(cpus) // tensor_parallel_size
    groups = [cpus[i * per : (i + 1) * per] for i in range(tensor_parallel_size)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def context_length(wanted: int | None, model_max: int | None) -> int | None:
    """The engine's max_model_len: what the run needs, at most what the model has."""
    if wanted is None or model_max is None:
        return wanted or model_max
    return min(wanted, model_max)
