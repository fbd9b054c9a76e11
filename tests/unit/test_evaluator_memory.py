"""The evaluator's memory does not grow with the number of held-out prompts.

A random Qwen2 student and teacher with a 16k vocabulary evaluate 32 and 256 held-out
prompts (2 responses of 8 new tokens each) in fresh processes, eval.batch_prompts = 32 and the prefill
micro-batched by a token budget: the peak RSS increase over the step (VmHWM, reset just
before it) is the same within a small margin. The same 256 prompts in one batch of 256
raise it far more: the check can see growth.
"""

import json
import os
import subprocess
import sys

import pytest

V = 16_000

CHILD = r"""
import json, sys
import numpy as np, torch
from opdflow.compute.device import peak_memory_gb, reset_peak_memory
from opdflow.stages.evaluator import Evaluator

root, prompts, batch_prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
ev = Evaluator(f"{root}/student", f"{root}/teacher", f"{root}/tokenizer", chunk_tokens=64,
               micro_batch_tokens=1024, batch_prompts=batch_prompts, device="cpu")
rng = np.random.default_rng(0)
ids = [rng.integers(3, 16000, 12).tolist() for _ in range(prompts)]
ev.heldout(ids[:4], [None] * 4, 2, 8, 0)  # warm-up: code loaded on first use

def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9

before = rss_gb()
reset_peak_memory(torch.device("cpu"))
out = ev.heldout(ids, [None] * prompts, 2, 8, 0)
assert len(out["kl_sum_P"]) == prompts and np.isfinite(out["kl"])
print(json.dumps({"increase_gb": peak_memory_gb(torch.device("cpu")) - before, "kl": out["kl"]}))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from opdflow.testbed.tokenizer import build_char_tokenizer

    root = tmp_path_factory.mktemp("evaluator_memory")
    cfg = Qwen2Config(
        vocab_size=V, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=256, max_position_embeddings=256,
        tie_word_embeddings=False,
    )  # fmt: skip
    for i, name in enumerate(("student", "teacher")):
        torch.manual_seed(i)
        Qwen2ForCausalLM(cfg).save_pretrained(root / name)
    # a tokenizer of V symbols, so every sampled id decodes
    build_char_tokenizer("".join(chr(0x100 + i) for i in range(V - 3)), root / "tokenizer")
    return root


def _peak(root, prompts: int, batch_prompts: int) -> float:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(prompts), str(batch_prompts)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["increase_gb"]


@pytest.mark.slow  # a memory measurement in fresh processes: not the fast tier
def test_held_out_memory_does_not_grow_with_the_prompt_count(models):
    few, many, unbatched = _peak(models, 32, 32), _peak(models, 256, 32), _peak(models, 256, 256)
    print(f"32 prompts: +{few:.3f} GB; 256 in batches of 32: +{many:.3f} GB; "
          f"256 at once: +{unbatched:.3f} GB")  # fmt: skip
    assert many <= 1.2 * few + 0.02  # 8x the prompts, the same peak
    assert unbatched > 2 * few  # one batch of 256 is what the budget prevents
