"""The held-out evaluation: when, on how many prompts, with which seed."""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import fail, in_range, positive


@dataclass
class EvalConfig:
    """Held-out KL: responses from the standard BF16 engine of the current student."""

    every: int = 10
    """Evaluate at step 0, every this many steps, and at the end."""
    prompts: int = 64
    """Held-out prompts used (the first ones of the held-out set, fixed across runs)."""
    samples_per_prompt: int = 4
    """Responses per held-out prompt."""
    seed: int = 1234
    """Sampling seed of the held-out responses, identical across runs for pairing."""
    batch_prompts: int = 64
    """Held-out prompts generated together (times samples_per_prompt responses): the
    evaluator's memory (KV cache, logits) follows this, not eval.prompts. Each prompt's
    responses are seeded by its index, so batching does not change them."""
    save_responses: bool = False
    """Also write every held-out response's text, reference answer and grade, one parquet
    file per evaluated version (heldout_responses/version_NNNNNN.parquet in the run
    directory), to read what the student answers or grade it again."""
    vllm_gpu_memory_utilization: float = 0.4
    """engine.kind = "vllm" on GPUs: share of the evaluator's GPU its BF16 vLLM engine may
    take; the rest holds the BF16 student and the teacher that score the responses. No
    effect on the CPU build."""

    def validate(self, path: str) -> None:
        positive(f"{path}.every", self.every)
        positive(f"{path}.prompts", self.prompts)
        positive(f"{path}.samples_per_prompt", self.samples_per_prompt)
        in_range(f"{path}.batch_prompts", self.batch_prompts, 1, 2**31 - 1)
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            fail(
                f"{path}.vllm_gpu_memory_utilization",
                self.vllm_gpu_memory_utilization,
                "a share in (0, 1]",
            )
