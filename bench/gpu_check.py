"""Every torch stage at real size on one GPU, with only torch and transformers installed.

    python bench/gpu_check.py                      # on a GPU: Qwen2.5-1.5B-shaped, 64 x 4,096
    python bench/gpu_check.py --device cpu --tiny  # the same code path, tiny (CI runs it)

Builds a student and a teacher shaped like Qwen2.5-1.5B (DeepSeek-R1-Distill-Qwen-1.5B's
config: 28 layers, hidden 1,536, 151,936-token vocabulary, untied head) from configs with
random weights; nothing is downloaded and no Ray or vLLM is needed: the stages are the
pipeline's own plain classes. For 64 responses of 4,096 tokens it runs, each on the device
and timed: TorchEngine sampling, the BF16 rescore, the teacher scoring and one learner step
(FSDP2 at world size 1, bf16 compute with FP32 master weights, micro-batches of
--micro-batch-tokens, activation checkpointing). It prints tokens/s per stage with the
model FLOPs utilisation it implies (2N FLOPs a token forward, 6N a training token, N the
matmul parameters; attention not counted, so it understates long sequences), each stage's
peak memory beside the memory plan's (opdflow.memory, as `opdflow validate --gpu-mem`
plans it: the learner step and the scorers' prefill traced on fake tensors, the engine
computed; on a GPU the allocator's peak, on a CPU the stage's tensors plus the resident
set's rise), and whether the micro-batched gradient equals the full-batch gradient on a
few responses (within the compute dtype's precision). --out writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, not installed
for _key, _value in {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                     "TRANSFORMERS_VERBOSITY": "error"}.items():  # fmt: skip
    os.environ.setdefault(_key, _value)

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0}
"""Dense bf16 tensor-core peaks (no sparsity) by device name, for MFU."""


def model_config(tiny: bool):
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
            tie_word_embeddings=False,
        )  # fmt: skip
    return Qwen2Config(  # DeepSeek-R1-Distill-Qwen-1.5B (Qwen2.5-Math-1.5B's shape)
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip


def build(config, path: Path, seed: int, device) -> int:
    """Random BF16 weights saved as a local checkpoint; returns the matmul parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    embed = model.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embed  # the lookup is not a matmul
    del model
    return n


class Meter:
    """Times a stage and reads its peak memory; collects the rows of the report."""

    def __init__(self, device, peak_tflops: float | None):
        self.device, self.peak, self.rows = device, peak_tflops, []

    def run(self, stage: str, tokens: int, flops_per_token: float, fn, *args, model=None,
            plan_gb: float | None = None, peak_of=None):  # fmt: skip
        """Time fn(*args) and read its peak memory (compute/device.py's PeakMemory: the
        allocator's peak on a GPU; on a CPU `model`'s tensors plus the resident set's rise),
        or take it from `peak_of(out)`, beside `plan_gb`, the memory plan's figure."""
        from opdflow.compute.device import PeakMemory, tensor_bytes

        self.sync()
        held = tensor_bytes(model.parameters()) if model is not None else 0
        memory = PeakMemory(self.device, held)
        t0 = time.perf_counter()
        out = fn(*args)
        self.sync()
        seconds = time.perf_counter() - t0
        tflops = tokens * flops_per_token / seconds / 1e12
        self.rows.append({
            "stage": stage, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "tflops": tflops, "mfu": tflops / self.peak if self.peak else None,
            "peak_mem_gb": peak_of(out) if peak_of else memory.gb(), "plan_gb": plan_gb,
        })  # fmt: skip
        return out

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def table(self) -> str:
        lines = [f"{'stage':<10} {'tokens':>9} {'s':>8} {'tokens/s':>10} {'TFLOP/s':>8} "
                 f"{'MFU':>6} {'peak GB':>8} {'plan GB':>8} {'peak/plan':>9}"]  # fmt: skip
        for r in self.rows:
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            plan = r["plan_gb"]
            ratio = f"{r['peak_mem_gb'] / plan:9.2f}" if plan else f"{'n/a':>9}"
            lines.append(
                f"{r['stage']:<10} {r['tokens']:>9} {r['seconds']:>8.2f} "
                f"{r['tokens_per_s']:>10.0f} {r['tflops']:>8.2f} {mfu:>6} {r['peak_mem_gb']:>8.2f}"
                f" {plan or 0:>8.2f} {ratio}"
            )
        return "\n".join(lines)


def memory_plans(student: Path, device, B: int, P: int, T: int, budget: int) -> dict[str, float]:
    """Each stage's planned peak in GB (opdflow.memory: the learner step and the prefill traced
    on fake tensors, the engine computed), as the device's allocator counts it (no CUDA
    context). Traced before any process group exists: the trace makes a fake one."""
    import numpy as np

    from opdflow.compute.scoring import DEFAULT_CHUNK_TOKENS
    from opdflow.core import microbatch
    from opdflow.memory import engine, trace
    from opdflow.memory.shape import model_shape

    shape = model_shape(str(student), "student")
    gpu = device.type == "cuda"
    plan = microbatch.plan(np.full(B, P), np.full(B, T), budget)
    rows = max(len(m) for m in plan)
    sampling = engine.torch_engine(shape, B, P + T)
    scorer = sum(trace.prefill(shape, rows, P, T, DEFAULT_CHUNK_TOKENS).values())
    step = trace.StepSetting(
        world=1, sharded=True, compute_dtype="bfloat16" if gpu else "float32",
        activation_checkpointing=True, rows=rows, prompt=P, response=T,
        micro_batches=len(plan), chunk=DEFAULT_CHUNK_TOKENS, foreach=gpu,
    )  # fmt: skip
    learner = max(sum(p.values()) for p in trace.learner_step(shape, step).values())
    engine_gb = sampling.weights + sampling.kv_cache + sampling.reserve - engine.CONTEXT_BYTES
    return {"sampling": engine_gb / 1e9, "rescore": scorer / 1e9, "teacher": scorer / 1e9,
            "learner": learner / 1e9}  # fmt: skip


def gradient_check(learner, batch, rows: int) -> dict:
    """The accumulated gradient over micro-batches of one response vs one pass over `rows`."""
    import torch

    part = batch.select(list(range(rows)))
    row_tokens = int(part.prompt_ids_B_P.shape[1] + part.response_ids_B_T.shape[1])
    grads = {}
    for budget in (0, row_tokens):  # the whole sub-batch at once; one response at a time
        learner.train_cfg = dataclasses.replace(learner.train_cfg, micro_batch_tokens=budget)
        learner.opt.zero_grad(set_to_none=True)
        learner.accumulate_gradients(part)
        grads[budget] = torch.cat([
            (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float().flatten()
            for p in learner.model.parameters()
        ])  # fmt: skip
    learner.opt.zero_grad(set_to_none=True)
    full, micro = grads[0], grads[row_tokens]
    rel = float((micro - full).norm() / full.norm().clamp_min(1e-30))
    cos = float(torch.nn.functional.cosine_similarity(micro, full, dim=0))
    tol = 1e-5 if learner.compute_dtype == torch.float32 else 2e-2  # bf16 matmuls round
    return {"rows": rows, "micro_batches": rows, "rel_err": rel, "cosine": cos,
            "tolerance": tol, "equal": rel <= tol}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if seen)")
    ap.add_argument("--tiny", action="store_true", help="tiny models and batch (CI, CPU)")
    ap.add_argument("--responses", type=int, default=None, help="default 64 (tiny: 8)")
    ap.add_argument("--tokens", type=int, default=None, help="per response; 4096 (tiny: 48)")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="default 256 (tiny: 8)")
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="learner/scorer token budget; default 3 responses (tiny: 2)")  # fmt: skip
    ap.add_argument("--peak-tflops", type=float, default=None, help="for MFU; default by name")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args()

    import numpy as np
    import torch

    from opdflow.compute.device import stage_device
    from opdflow.config import TrainConfig
    from opdflow.engines.base import GenerationRequest, SamplingParams
    from opdflow.engines.torch_engine import TorchEngine
    from opdflow.stages.learner import Learner
    from opdflow.stages.rescorer import Rescorer
    from opdflow.stages.teacher import TeacherScorer

    device = stage_device(args.device)
    B = args.responses or (8 if args.tiny else 64)
    T = args.tokens or (48 if args.tiny else 4096)
    P = args.prompt_tokens or (8 if args.tiny else 256)
    budget = args.micro_batch_tokens or (2 if args.tiny else 3) * (P + T)
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    print(f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}; {B} responses x {T} tokens after {P}-token prompts; "
          f"micro-batches of {budget} tokens", flush=True)  # fmt: skip
    config = model_config(args.tiny)
    meter = Meter(device, peak)
    with tempfile.TemporaryDirectory(prefix="opdflow-gpu-check-") as tmp:
        student, teacher = Path(tmp) / "student", Path(tmp) / "teacher"
        n = build(config, student, 0, device)
        build(config, teacher, 1, device)
        print(f"built student and teacher: {n / 1e6:,.1f}M matmul parameters each", flush=True)
        plans = memory_plans(student, device, B, P, T, budget)
        print("memory plan (GB): " + ", ".join(f"{k} {v:.2f}" for k, v in plans.items()),
              flush=True)  # fmt: skip

        never = config.vocab_size  # an EOS id no model samples: every response is T tokens
        engine = TorchEngine(str(student), 0, never, "bf16", str(device))
        rng = np.random.default_rng(0)
        prompts = [rng.integers(1, config.vocab_size, P).tolist() for _ in range(B)]
        request = GenerationRequest(prompts, list(range(B)), [None] * B, 1, 0, 0,
                                    SamplingParams(1.0, 1.0, T))  # fmt: skip
        batch = meter.run("sampling", B * T, 2 * n, engine.generate, request,
                          model=engine.model, plan_gb=plans["sampling"])  # fmt: skip
        del engine

        rescorer = Rescorer(str(student), micro_batch_tokens=budget, device=str(device))
        batch = meter.run("rescore", batch.num_tokens, 2 * n, rescorer.rescore, batch,
                          model=rescorer.model, plan_gb=plans["rescore"])  # fmt: skip
        del rescorer
        scorer = TeacherScorer(str(teacher), micro_batch_tokens=budget, device=str(device))
        batch = meter.run("teacher", batch.num_tokens, 2 * n, scorer.score, batch,
                          model=scorer.model, plan_gb=plans["teacher"])  # fmt: skip
        del scorer
        if device.type == "cuda":
            torch.cuda.empty_cache()

        train = TrainConfig(lr=1e-6, micro_batch_tokens=budget, activation_checkpointing=True)
        learner = Learner(str(student), train, device=str(device), shard=True)
        learner.train_step(0, batch.select([0]))  # warm-up: kernels, allocator, AdamW moments
        out = meter.run(
            "learner",
            batch.num_tokens,
            6 * n,
            learner.train_step,
            1,
            batch,
            plan_gb=plans["learner"],
            peak_of=lambda m: m["learner_peak_mem_gb"],
        )
        grad = gradient_check(learner, batch, rows=min(4, B))

    print(meter.table())
    print(
        f"learner: {out['micro_batches']} micro-batches, loss {out['loss']:.4f}, "
        f"peak {out['learner_peak_mem_gb']:.2f} GB, compute {learner.compute_dtype}"
    )
    print(
        f"micro-batched gradient == full-batch gradient on {grad['rows']} responses: "
        f"{'yes' if grad['equal'] else 'NO'} (relative error {grad['rel_err']:.2e}, "
        f"cosine {grad['cosine']:.6f}, tolerance {grad['tolerance']:g})"
    )
    if args.out:
        args.out.write_text(json.dumps({"device": str(device), "stages": meter.rows,
                                        "gradient": grad, "learner": {
                                            k: out[k] for k in ("loss", "micro_batches",
                                                                "learner_peak_mem_gb")}},
                                       indent=2))  # fmt: skip
    return 0 if grad["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
