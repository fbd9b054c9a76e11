"""A rollout engine's GPU memory: weights, what it reserves to run, and the KV cache.

vLLM sizes itself: at start it takes `gpu_memory_utilization` of the GPU (each GPU of a
tensor-parallel replica), loads its weights shard, profiles one forward of its largest
batch, and gives what is left of its share to the KV cache. vLLM is not installed where
`opdflow validate` runs (nor traceable on fake tensors), so its parts are computed here the
way it accounts them: weights per shard, a runtime reserve (the profiled forward's
activations, the sampler's logits, CUDA graphs, the CUDA context), and the KV cache's token
capacity at the recipe's KV dtype (fp8_kv: one byte per element, two where a layer keeps a
BF16 cache). The reserve's inputs are vLLM's defaults for its offline `LLM` class on large
GPUs, which VLLMEngine leaves as they are; they are assumed, and said so in the plan.

TorchEngine (engine.kind = "torch") keeps its BF16 student and a KV cache for the rows it
samples at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.core.recipe import parse_recipe
from opdflow.memory.shape import ModelShape

GB = 1e9

VLLM_BATCHED_TOKENS = 16384
"""vLLM's max_num_batched_tokens (assumed default): the tokens of its profiled forward."""
VLLM_MAX_SEQS = 1024
"""vLLM's max_num_seqs (assumed default): rows whose logits its sampler holds at once."""
VLLM_GRAPHS_BYTES = 1.0 * GB
"""CUDA graphs of vLLM's decode batch sizes (assumed)."""
CONTEXT_BYTES = 1.0 * GB
"""A process's CUDA context, cuBLAS workspace and NCCL buffers (assumed): device memory no
allocator counts."""


@dataclass(frozen=True)
class EngineMemory:
    """One engine's parts (bytes) on one GPU, and its KV cache's token capacity."""

    weights: float
    reserve: float
    """The profiled forward's activations, the sampler's logits, CUDA graphs and context."""
    kv_cache: float
    kv_tokens: int
    """Tokens the KV cache holds (0 when the share leaves it no room)."""
    kv_bytes_per_token: float


def kv_element_bytes(recipe: str, num_layers: int) -> tuple[float, str]:
    """Mean bytes of a KV cache element over the layers under `recipe`, and what it is."""
    kv = parse_recipe(recipe).kv_part
    if kv is None:
        return 2.0, "BF16"
    fp8 = len(kv.layer_set(num_layers))
    mean = (fp8 * 1.0 + (num_layers - fp8) * 2.0) / num_layers
    kept = f", {num_layers - fp8} layers BF16" if fp8 < num_layers else ""
    return mean, f"FP8{kept}"


def vllm(shape: ModelShape, tp: int, share_bytes: float, recipe: str = "bf16") -> EngineMemory:
    """vLLM at `share_bytes` (gpu_memory_utilization x the GPU) on each of `tp` GPUs."""
    fp8_weights = any(p.name == "fp8" for p in parse_recipe(recipe).parts)
    linear = shape.layers * shape.layer_params()
    other = shape.params() - linear
    weights = (linear * (1 if fp8_weights else 2) + other * 2) / tp
    width = 4 * shape.hidden + (3 * shape.intermediate) // tp  # residual, qkv/o, gate+up, act
    activations = VLLM_BATCHED_TOKENS * width * 2
    sampler = VLLM_MAX_SEQS * shape.vocab * 4 * 2  # logits and logprobs, float32
    reserve = activations + sampler + VLLM_GRAPHS_BYTES + CONTEXT_BYTES
    per_token = shape.kv_bytes_per_token(kv_element_bytes(recipe, shape.layers)[0], tp)
    kv = max(share_bytes - weights - reserve, 0.0)
    return EngineMemory(weights, reserve, kv, int(kv // per_token), per_token)


def torch_engine(shape: ModelShape, rows: int, tokens: int) -> EngineMemory:
    """TorchEngine's BF16 student and its KV cache for `rows` rows of `tokens` tokens."""
    per_token = shape.kv_bytes_per_token(2.0)
    logits = rows * shape.vocab * 4 * 2
    return EngineMemory(
        shape.params() * 2.0,
        logits + CONTEXT_BYTES,
        rows * tokens * per_token,
        rows * tokens,
        per_token,
    )
