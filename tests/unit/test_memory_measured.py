"""The memory plan against the learner's measured peak: 12 points on CPU, each within 25%.

The Qwen2-shaped student of test_learner_memory.py (51M parameters, 32k vocabulary, random
weights) takes learner steps at three train.micro_batch_tokens (one, two and four 272-token
responses per micro-batch), with and without activation checkpointing, at 1 rank (one FP32
module) and 2 ranks (FSDP2 over gloo, two processes). Each rank holds four responses, so a
step has 4, 2 or 1 micro-batches. Each (ranks, checkpointing) pair runs in fresh processes:
a warm-up step at the smallest budget (what a run's first step touches for the first time,
the heap's arenas among it, reads about 0.1 GB high on 2 ranks; and AdamW's moments exist
from then on, as in every later step), then one step per budget, smallest first; `learner_peak_mem_gb` of each is the measured figure
(compute/device.py: the tensors the learner holds plus the rise of its resident set; glibc
returns freed buffers with MALLOC_MMAP_THRESHOLD_ fixed at 1 MiB). The plan is
opdflow.memory.learner.learner_plan for the same step on a CPU, traced on fake tensors.

Activations and logits matter at this size: without checkpointing the plan rises by more
than a fifth from the smallest micro-batch to the largest, and so does the measured peak.
`python -m pytest tests/unit/test_memory_measured.py -s` prints the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

P, T, V = 16, 256, 32_000
ROWS_PER_RANK = 4
BUDGET_ROWS = (1, 2, 4)
TOLERANCE = 0.25
REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import dataclasses, json, sys
import torch
from safetensors.numpy import load_file
from opdflow.config import TrainConfig
from opdflow.core.rollout import RolloutBatch
from opdflow.compute.fsdp import DistSpec
from opdflow.stages.learner import Learner

root, ac, rank, world, init = sys.argv[1], sys.argv[2] == "1", *map(int, sys.argv[3:5]), sys.argv[5]
budgets = [int(b) for b in sys.argv[6].split(",")]
torch.set_num_threads(1)
batch = RolloutBatch(version=0, **load_file(f"{root}/batch_{world}.safetensors"))
train = TrainConfig(lr=1e-6, micro_batch_tokens=budgets[0], activation_checkpointing=ac)
dist = DistSpec(rank, world, init) if world > 1 else None
learner = Learner(f"{root}/student", train, device="cpu", dist=dist)
learner.train_step(0, batch)  # warm-up: the first budget's step, once
peaks = []
for step, budget in enumerate(budgets, 1):
    learner.train_cfg = dataclasses.replace(train, micro_batch_tokens=budget)
    out = learner.train_step(step, batch)
    peaks.append({"budget": budget, "peak_gb": out["learner_peak_mem_gb"],
                  "micro_batches": out["micro_batches"]})
learner.close()
if rank == 0:
    print(json.dumps(peaks))
"""


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The 51M-parameter Qwen2 of test_learner_memory.py and a batch for 1 and 2 ranks."""
    import torch
    from safetensors.numpy import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("memory_measured")
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

    def batch(rows: int, width: int) -> dict:
        logp = rng.normal(-10.0, 1.0, (rows, width)).astype(np.float32)
        return {
            "prompt_ids_B_P": rng.integers(0, V, (rows, P)),
            "prompt_mask_B_P": np.ones((rows, P), bool),
            "response_ids_B_T": rng.integers(0, V, (rows, width)),
            "response_mask_B_T": np.ones((rows, width), bool),  # full length: the plan's rows
            "logp_engine_B_T": logp,
            "logp_rescore_B_T": logp,
            "logp_teacher_B_T": logp + 0.5,
            "prompt_index_B": np.arange(rows),
        }

    for world in (1, 2):
        save_file(batch(ROWS_PER_RANK * world, T), root / f"batch_{world}.safetensors")
    return root


def _measure(root: Path, world: int, ac: bool) -> list[subprocess.Popen]:
    from opdflow.compute.fsdp import free_port

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20), "PYTHONPATH": str(REPO)}
    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    budgets = ",".join(str(r * (P + T)) for r in BUDGET_ROWS)
    args = [sys.executable, "-c", CHILD, str(root), "1" if ac else "0"]
    return [
        subprocess.Popen(
            [*args, str(rank), str(world), init, budgets],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(world)
    ]


def _collect(procs: list[subprocess.Popen]) -> list[dict]:
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return json.loads(outs[0][0].strip().splitlines()[-1])


def _plan_gb(root: Path, cache: Path, world: int, ac: bool, rows: int) -> float:
    from opdflow.config import PipelineConfig
    from opdflow.memory.learner import learner_plan, step_setting
    from opdflow.memory.shape import model_shape

    cfg = PipelineConfig()
    cfg.models.cache_dir = str(cache)
    cfg.data.max_prompt_tokens, cfg.engine.max_new_tokens = P, T
    cfg.train.micro_batch_tokens, cfg.train.activation_checkpointing = rows * (P + T), ac
    cfg.resources.learner.workers = world
    setting = step_setting(cfg, gpu=False, rows=ROWS_PER_RANK * world)
    shape = model_shape(str(root / "student"), "models.student")
    return learner_plan(cfg, shape, False, print, setting, other=False).peak / 1e9


@pytest.mark.slow
def test_the_learner_peak_is_within_a_quarter_of_the_plan(student, tmp_path):
    runs = [(1, False), (1, True), (2, False), (2, True)]
    measured: dict[tuple, dict] = {}
    # the two one-rank runs together (a core each), then each two-rank pair
    waves = [[(1, False), (1, True)], [(2, False)], [(2, True)]]
    for wave in waves:
        started = {run: _measure(student, *run) for run in wave}
        for run, procs in started.items():
            for row in _collect(procs):
                measured[(*run, row["budget"] // (P + T))] = row
    lines = ["ranks  checkpointing  rows/micro-batch  micro-batches  plan GB  measured GB  ratio"]
    started = time.perf_counter()
    ratios = {}
    for world, ac in runs:
        for rows in BUDGET_ROWS:
            plan = _plan_gb(student, tmp_path / "cache", world, ac, rows)
            got = measured[(world, ac, rows)]
            ratios[(world, ac, rows)] = (plan, got["peak_gb"])
            lines.append(
                f"{world:>5}  {'on' if ac else 'off':>13}  {rows:>16}  {got['micro_batches']:>13}"
                f"  {plan:7.3f}  {got['peak_gb']:11.3f}  {got['peak_gb'] / plan:5.2f}"
            )
    lines.append(
        f"(planned in {time.perf_counter() - started:.0f} s; micro-batches: over all ranks)"
    )
    print("\n".join(lines))
    for point, (plan, got) in ratios.items():
        assert abs(got / plan - 1) <= TOLERANCE, (point, plan, got, "\n".join(lines))
    for world in (1, 2):  # the budget moves the peak, as planned
        lo, hi = ratios[(world, False, BUDGET_ROWS[0])], ratios[(world, False, BUDGET_ROWS[-1])]
        assert hi[0] - lo[0] > 0.2 * lo[0], (world, lo, hi)  # not a test of fixed state only
        assert hi[1] > lo[1], (world, lo, hi)
