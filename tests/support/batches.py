"""Real rollout batches for tests: the tiny student samples from the tiny training prompts."""

from __future__ import annotations


def sampled_batch(tiny, tokenizer, prompts: int, n: int, max_new_tokens: int, seed: int = 0):
    """`n` responses to each of the first `prompts` training prompts, sampled by the BF16
    tiny student's TorchEngine (a RolloutBatch with the engine's logprobs only)."""
    from opdflow.engines.base import GenerationRequest, SamplingParams
    from opdflow.engines.torch_engine import TorchEngine
    from opdflow.inputs.data import load_prompts

    p = load_prompts(tiny.train, tokenizer, limit=prompts)
    engine = TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id)
    request = GenerationRequest(
        p.token_ids, list(range(prompts)), p.answers, n, seed, 0,
        SamplingParams(max_new_tokens=max_new_tokens),
    )  # fmt: skip
    return engine.generate(request)
