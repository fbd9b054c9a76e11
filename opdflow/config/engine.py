"""The rollout engine: its kind, its precision recipe, its pool size and its sampling.

The recipe is checked with the grammar in opdflow.core.recipe, so a bad one fails at load
with the field named, before any engine is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import fail, in_range, one_of, positive
from opdflow.core.recipe import parse_recipe
from opdflow.errors import ConfigError


@dataclass
class EngineConfig:
    """The rollout engine: the configuration c whose mismatch the study measures."""

    kind: str = "torch"
    """"torch" (TorchEngine, runs anywhere) or "vllm" (pip install opdflow[vllm])."""
    recipe: str = "bf16"
    """Precision recipe of the rollout engine, e.g. "bf16", "fp8", "noise(0.15)"."""
    replicas: int = 1
    """Generator actors in the pool at the start."""
    min_replicas: int | None = None
    """Fewest generator actors the pool shrinks to (None = replicas: a fixed-size pool)."""
    max_replicas: int | None = None
    """Most generator actors the pool grows to when the scheduler asks for more generation or
    queued work exceeds the ready replicas (None = replicas). On a cluster, replicas beyond
    the running nodes stay pending until the Ray autoscaler adds a node for them."""
    scale_down_idle_s: float = 30.0
    """Grace period, in seconds: a replica is retired (down to min_replicas) once, over the
    last this-many seconds, the other replicas could have done all the generation at most
    70% busy; it finishes its in-flight work first. Also the minimum time between resizes."""
    temperature: float = 1.0
    """Sampling temperature; logprobs are those of the distribution actually sampled from."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    max_new_tokens: int = 8
    """Response length cap, in tokens."""
    exact_kl_max_vocab: int = 4096
    """Compute exact full-vocabulary KL when the vocabulary is at most this large."""
    tensor_parallel_size: int = 1
    """engine.kind = "vllm": GPUs one replica spans with tensor parallelism (one placement
    bundle of that many GPUs on one node: resources.generator.num_gpus must equal it). GPUs
    only; 1 on vLLM's CPU build."""
    gpu_memory_utilization: float = 0.9
    """engine.kind = "vllm" on GPUs: share of each of its GPUs a replica's vLLM may take
    (weights, activations, CUDA graphs and KV cache). No effect on the CPU build."""

    def validate(self, path: str) -> None:
        one_of(f"{path}.kind", self.kind, ("torch", "vllm"))
        positive(f"{path}.replicas", self.replicas)
        lo = self.replicas if self.min_replicas is None else self.min_replicas
        hi = self.replicas if self.max_replicas is None else self.max_replicas
        if isinstance(lo, int) and not 1 <= lo <= self.replicas:
            fail(f"{path}.min_replicas", lo, f"an integer in [1, replicas={self.replicas}]")
        if isinstance(hi, int) and hi < self.replicas:
            fail(f"{path}.max_replicas", hi, f"an integer >= replicas={self.replicas}")
        positive(f"{path}.scale_down_idle_s", self.scale_down_idle_s)
        positive(f"{path}.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            fail(f"{path}.top_p", self.top_p, "a number in (0, 1]")
        positive(f"{path}.max_new_tokens", self.max_new_tokens)
        in_range(f"{path}.tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        if self.tensor_parallel_size > 1 and self.kind != "vllm":
            fail(
                f"{path}.tensor_parallel_size",
                self.tensor_parallel_size,
                "1 unless engine.kind = 'vllm' (TorchEngine runs on one device)",
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            fail(f"{path}.gpu_memory_utilization", self.gpu_memory_utilization, "a share in (0, 1]")
        if not isinstance(self.recipe, str) or not self.recipe.strip():
            fail(f"{path}.recipe", self.recipe, 'a recipe name such as "bf16"')
        try:
            parse_recipe(self.recipe)
        except ConfigError as exc:
            raise ConfigError(f"{path}.recipe: {exc}") from exc
