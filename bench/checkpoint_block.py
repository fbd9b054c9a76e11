"""How long a learner checkpoint blocks the step: a synchronous save vs a background one.

    PYTHONPATH=. python bench/checkpoint_block.py [--hidden 512] [--layers 6] [--vocab 32768]
                                                   [--repeats 3] [--dir DIR] [--out FILE]
    PYTHONPATH=. python bench/checkpoint_block.py --quick      # CI size: seconds

A Qwen2-shaped student with random weights (default 51M parameters: hidden 512, 6 layers,
a 32k vocabulary, as tests/unit/test_learner_memory.py) is built, loaded by the run's own
`Learner` (one unsharded FP32 worker) and given AdamW moments by one optimizer step. Each
repeat then saves a checkpoint with `Learner.save_checkpoint` both ways, into --dir (the
checkpoint directory's disk; default a temporary directory):

- sync (reliability.async_checkpoint=false): block_s is the whole write.
- background (the default): block_s is the call (the state staged into host memory of its
  own); written_s is until `checkpoint_written` says every file is complete; the learner
  trains one step's optimizer update on the weights meanwhile, as a run would.

The table gives the median over --repeats (after one warm-up save of each kind) and the
state's bytes (FP32 weights and two AdamW moments).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def build(root: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A random Qwen2 student saved with save_pretrained under root/student."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 256),
        intermediate_size=3 * hidden, max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen2ForCausalLM(cfg).save_pretrained(root / "student")
    return root / "student"


def step(learner) -> None:
    """An optimizer update of every weight (the AdamW moments exist after the first)."""
    import torch

    for p in learner.model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    learner.opt.step()
    learner.opt.zero_grad(set_to_none=True)


def measure(learner, out: Path, background: bool) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    learner.save_checkpoint(str(out), background)
    block = time.perf_counter() - t0
    if background:
        step(learner)  # the next step's update, while the files are written
        learner.checkpoint_written(wait=True)
    return {"block_s": block, "written_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where checkpoints are written")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    ap.add_argument("--quick", action="store_true", help="a tiny student, one repeat")
    a = ap.parse_args(argv)
    if a.quick:
        a.hidden, a.layers, a.vocab, a.repeats = 64, 2, 512, 1
    from opdflow.config import TrainConfig
    from opdflow.stages.learner import Learner

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(a.dir or tmp)
        where.mkdir(parents=True, exist_ok=True)
        learner = Learner(str(build(Path(tmp), a.hidden, a.layers, a.vocab)), TrainConfig())
        step(learner)
        params = sum(p.numel() for p in learner.model.parameters())
        runs: dict[str, list[dict[str, float]]] = {"sync": [], "background": []}
        for i in range(a.repeats + 1):  # the first of each is a warm-up
            for mode in runs:
                r = measure(learner, where / f"ckpt-{mode}", mode == "background")
                if i:
                    runs[mode].append(r)
        shutil.rmtree(where / "ckpt-sync", ignore_errors=True)
        shutil.rmtree(where / "ckpt-background", ignore_errors=True)
    result = {
        "params": params,
        "state_bytes": 3 * 4 * params,
        **{
            f"{mode}_{key}": statistics.median(r[key] for r in rs)
            for mode, rs in runs.items()
            for key in ("block_s", "written_s")
        },
    }
    print(f"student: {params / 1e6:.1f}M parameters, {result['state_bytes'] / 1e9:.2f} GB "
          f"of FP32 weights and AdamW moments; median of {a.repeats}")  # fmt: skip
    print(f"{'save':<12}{'blocks the step':>18}{'written after':>16}")
    for mode in runs:
        print(f"{mode:<12}{result[f'{mode}_block_s']:>16.3f} s"
              f"{result[f'{mode}_written_s']:>14.3f} s")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
