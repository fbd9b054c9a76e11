"""Learner memory follows the token budget, not the batch, and the gradient does not change.

A Qwen2-shaped student of 51M parameters with a 32k vocabulary (random weights, saved as a
local checkpoint) takes one learner step on 16 responses of 512 tokens, in a fresh
process each: once with train.micro_batch_tokens=0 (the whole batch in one forward and
backward) and once with 1,024 (one response per micro-batch, two short ones). Its peak RSS during the step
(VmHWM, reset just before it) above the RSS before it must be at most a quarter of the
unbounded step's, and the accumulated gradient must equal the full-batch gradient within
float tolerance. Both steps first take a one-response warm-up step, so code loaded on first
use and the parameter gradients sit in the baseline.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

B, P, T, V = 16, 16, 512, 32_000
BUDGET = 1024
"""Tokens per micro-batch: a full response (P + T) alone, two short ones (P + SHORT) together."""
SHORT = 450

CHILD = r"""
import json, sys
import numpy as np, torch
from safetensors.numpy import load_file
from safetensors.torch import save_file
from opdflow.config import TrainConfig
from opdflow.compute.device import peak_memory_gb, reset_peak_memory
from opdflow.core.rollout import RolloutBatch
from opdflow.stages.learner import Learner

model, batch_file, budget, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(2)
arrays = load_file(batch_file)
batch = RolloutBatch(version=0, **arrays)
learner = Learner(model, TrainConfig(micro_batch_tokens=budget, logit_chunk_tokens=256),
                  device="cpu", shard=False)
learner.accumulate_gradients(batch.select([0]).select([0]))  # warm-up: grads allocated
learner.model.zero_grad(set_to_none=False)

def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9

before = rss_gb()
reset_peak_memory(torch.device("cpu"))
learner.accumulate_gradients(batch)
peak = peak_memory_gb(torch.device("cpu"))
save_file({n: p.grad for n, p in learner.model.named_parameters()}, out)
print(json.dumps({"before_gb": before, "peak_gb": peak, "increase_gb": peak - before,
                  "micro_batches": len(learner.micro_batches(batch))}))
"""


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A 51M-parameter Qwen2 (hidden 512, 6 layers, 32k vocabulary, untied head) and a batch."""
    import torch
    from safetensors.numpy import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("learner_memory")
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=V, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=1536, max_position_embeddings=2048,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    assert sum(p.numel() for p in model.parameters()) >= 50e6
    model.save_pretrained(root / "student")
    rng = np.random.default_rng(0)
    mask = np.ones((B, T), bool)
    mask[1::2, SHORT:] = False  # ragged responses
    logp = rng.normal(-10.0, 1.0, (B, T)).astype(np.float32)
    save_file(
        {
            "prompt_ids_B_P": rng.integers(0, V, (B, P)),
            "prompt_mask_B_P": np.ones((B, P), bool),
            "response_ids_B_T": rng.integers(0, V, (B, T)),
            "response_mask_B_T": mask,
            "logp_engine_B_T": logp,
            "logp_rescore_B_T": logp,
            "logp_teacher_B_T": logp + rng.normal(0.5, 1.0, (B, T)).astype(np.float32),
            "prompt_index_B": np.repeat(np.arange(B // 4), 4),
        },
        root / "batch.safetensors",
    )
    return root


def _step(student, budget: int) -> dict:
    # buffers above 1 MiB get their own mapping and go back to the OS when freed, so RSS
    # follows the tensors alive, not what glibc's heap kept from earlier micro-batches
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    out = student / f"grad_{budget}.safetensors"
    args = [str(student / "student"), str(student / "batch.safetensors"), str(budget), str(out)]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "grads": out}


@pytest.mark.slow
def test_micro_batches_bound_the_learner_step_and_keep_its_gradient(student):
    from safetensors.torch import load_file
    from torch.testing import assert_close

    whole, micro = _step(student, 0), _step(student, BUDGET)
    print(f"unbounded: {whole}\nmicro_batch_tokens={BUDGET}: {micro}")
    assert whole["micro_batches"] == 1 and micro["micro_batches"] == 12  # short ones in pairs
    assert micro["increase_gb"] <= whole["increase_gb"] / 4, (whole, micro)
    ref, got = load_file(whole["grads"]), load_file(micro["grads"])
    assert ref.keys() == got.keys()
    for name in ref:
        assert_close(got[name], ref[name], rtol=1e-4, atol=1e-7, msg=name)
    assert max(float(g.abs().max()) for g in ref.values()) > 1e-4  # a real gradient
