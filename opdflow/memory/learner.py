"""The learner's part of the memory plan: rank 0's traced step, and the traces' disk cache.

Rank 0 holds the largest shards (FSDP2 pads rows onto the first ranks) and publishes the
weights, so its plan is every rank's bound. Its step is traced (trace.py) for the largest
micro-batch the step's rows give it (core/microbatch.py, as the learner deals them), once
with the pipeline's activation-checkpointing setting and once with the other one. Traces
are kept on disk under the model cache (`$OPDFLOW_CACHE/memory-plan`), keyed by the
model's shape, the traced setting and the torch and transformers versions, so a second
`opdflow validate` of a pipeline does not trace again. Weight publishing follows the
weights path's design: whatever the transport, a version's bytes are staged in host
memory; "collective" moves them in buckets of `weights.bucket_mb`, at most two of them on
the learner's GPU and on each consumer's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from importlib import metadata

import numpy as np

from opdflow.config import PipelineConfig
from opdflow.core import microbatch
from opdflow.memory import engine, trace
from opdflow.memory.plan import GB, ActorPlan, Part
from opdflow.memory.shape import ModelShape

CACHE_VERSION = 3
"""Bump when what a trace measures changes: cached traces of other versions are ignored."""

Log = Callable[[str], None]


def cached(cfg: PipelineConfig, key: dict, compute: Callable[[], dict], log: Log) -> dict:
    """compute(), or its result for the same key from an earlier run."""
    from opdflow.testbed.zoo import cache_root

    key = {
        **key,
        "version": CACHE_VERSION,
        "torch": metadata.version("torch"),
        "transformers": metadata.version("transformers"),
    }
    what = key.pop("what")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_root(cfg.models.cache_dir) / "memory-plan" / f"{digest}.json"
    if path.is_file():
        return json.loads(path.read_text())["result"]
    log(f"tracing {key['kind']} on fake tensors ({what}); cached for next time")
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "result": result}))
    tmp.replace(path)
    return result


def _rows_per_rank(cfg: PipelineConfig, workers: int, rows: int) -> tuple[int, int]:
    """(rows of rank 0's largest micro-batch, its micro-batches) for `rows` full-length rows."""
    d, e = cfg.data, cfg.engine
    plan = microbatch.plan(
        np.full(rows, d.max_prompt_tokens),
        np.full(rows, e.max_new_tokens),
        cfg.train.micro_batch_tokens,
        workers,
    )
    mine = [m for m in microbatch.deal(plan, workers)[0] if m is not None]
    return max(len(m) for m in mine), len(mine)


def step_setting(
    cfg: PipelineConfig, gpu: bool, rows: int | None = None, workers: int | None = None
) -> trace.StepSetting:
    """What rank 0 of the learner runs in a step: on a GPU (sharded, bf16 by default,
    foreach AdamW) or a CPU (sharded from 2 ranks on, float32 by default)."""
    t, d = cfg.train, cfg.data
    n = workers or cfg.resources.learner.workers
    mb_rows, count = _rows_per_rank(cfg, n, rows or d.prompts_per_step * d.responses_per_prompt)
    compute = t.compute_dtype if t.compute_dtype != "auto" else ("bfloat16" if gpu else "float32")
    return trace.StepSetting(
        world=n, sharded=n > 1 or gpu, compute_dtype=compute,
        activation_checkpointing=t.activation_checkpointing, rows=mb_rows,
        prompt=d.max_prompt_tokens, response=cfg.engine.max_new_tokens, micro_batches=count,
        chunk=t.logit_chunk_tokens, foreach=gpu, gloo=not gpu and n > 1,
    )  # fmt: skip


def learner_phases(
    cfg: PipelineConfig, shape: ModelShape, setting: trace.StepSetting, log: Log
) -> dict[str, dict[str, int]]:
    """The traced step (bytes by part at each phase's peak), cached."""
    key = {"kind": "learner step", "what": f"{setting.world} rank(s), "
           f"{setting.rows} x {setting.prompt + setting.response} tokens, "
           f"checkpointing {'on' if setting.activation_checkpointing else 'off'}",
           "shape": shape.config, "setting": dataclasses.asdict(setting)}  # fmt: skip
    return cached(cfg, key, lambda: trace.learner_step(shape, setting), log)


def buckets(cfg: PipelineConfig, who: str) -> Part | None:
    from opdflow.weights.transport import for_pipeline

    if not for_pipeline(cfg).needs_receiver:  # the object store: staged in host memory
        return None
    mb = cfg.weights.bucket_mb
    return Part(
        "weight buckets", 2 * mb * 2**20, f"collective: 2 x {mb} MiB, {who}",
        f"weights.bucket_mb (now {mb}; lower)",
    )  # fmt: skip


def learner_plan(
    cfg: PipelineConfig,
    shape: ModelShape,
    gpu: bool,
    log: Log,
    setting: trace.StepSetting | None = None,
    other: bool = True,
) -> ActorPlan:
    """Rank 0 of the learner (the largest shards; it publishes the weights) on a GPU, or its
    process on a CPU; `other`: also trace the other activation-checkpointing setting."""
    setting = setting or step_setting(cfg, gpu)
    phases = learner_phases(cfg, shape, setting, log)
    flip = not setting.activation_checkpointing
    alt = (
        learner_phases(cfg, shape, dataclasses.replace(setting, activation_checkpointing=flip), log)
        if other
        else None
    )
    n, t = setting.world, cfg.train
    phase = max(phases, key=lambda k: sum(phases[k].values()))
    at = phases[phase]
    of = f"1/{n} of the model" if n > 1 else "the whole model"
    ranks = f"resources.learner.workers (now {n}; more ranks hold smaller shards)"
    tokens = setting.rows * (setting.prompt + setting.response)
    ac = "on" if setting.activation_checkpointing else "off"
    act_field = (
        f"train.micro_batch_tokens (now {t.micro_batch_tokens:,}; lower)" if setting.rows > 1
        else "train.activation_checkpointing (now false; true)"
        if not setting.activation_checkpointing
        else None
    )  # fmt: skip
    parts = [
        Part("parameters", at["parameters"], f"FP32 master weights, {of}", ranks),
        Part("gradients", at["gradients"], f"FP32, {of}", ranks),
        Part("optimizer state", at["optimizer"], f"AdamW's two moments, FP32, {of}", ranks),
    ]
    if phase == "micro-batch":
        parts += [
            Part("gathered parameters", at["gathered"],
                 f"all-gathered in {setting.compute_dtype} for compute (embeddings, head, layers)"),
            Part("activations", at["activations"],
                 f"micro-batch of {setting.rows} x {setting.prompt + setting.response:,} = "
                 f"{tokens:,} tokens, checkpointing {ac}; logits chunks, reduce-scatter", act_field),
        ]  # fmt: skip
    else:
        parts.append(Part("optimizer step", at["activations"], "AdamW's temporaries", ranks))
    publish = buckets(cfg, "host-staged version sent from here") if gpu else None
    parts.append(publish or Part("weight publishing", 0.0, "object_store: staged in host memory"))
    if gpu:  # weights/cast.py: full tensors gathered one at a time on a side stream
        largest = max(shape.vocab, shape.intermediate) * shape.hidden * 2
        parts.append(Part("publish cast", 2 * largest, "BF16 cast beside the next step: the "
                          "largest tensor gathered whole, two in flight"))  # fmt: skip
    if gpu:
        parts.append(Part("CUDA context, NCCL", engine.CONTEXT_BYTES, "assumed"))
    other_phase = "optimizer step" if phase == "micro-batch" else "micro-batch"
    notes = [
        f"peak in the {phase}; the {other_phase} peaks at "
        f"{sum(phases[other_phase].values()) / GB:.1f} GB (steps after the first: AdamW's "
        "moments exist)",
        f"logits chunk: {setting.chunk:,} tokens x {shape.vocab:,} vocabulary = "
        f"{setting.chunk * shape.vocab * 4 / GB:.2f} GB per FP32 copy (train.logit_chunk_"
        "tokens), part of the activations while the head runs",
    ]
    if alt is not None:
        notes.insert(1, f"activation checkpointing {'on' if flip else 'off'}: activations "
                     f"{alt['micro-batch']['activations'] / GB:.1f} GB, step peak "
                     f"{max(sum(v.values()) for v in alt.values()) / GB:.1f} GB")  # fmt: skip
    label = "learner" if n == 1 else f"learner[0-{n - 1}]"
    return ActorPlan(label, 1.0, parts=parts, notes=notes)
