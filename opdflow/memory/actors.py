"""A pipeline's memory plan, stage by stage: `plan_pipeline` builds every GPU actor's.

The learner's ranks come from learner.py; the rollout engines' parts from engine.py; the
rescorer's, the teacher's and the evaluator's prefill is traced (trace.py, cached like the
learner's step), their weights are BF16 copies of the model. Each actor is planned on the
GPU its node has (`gpu_of`): actors of a stage on GPUs of one size share one plan.
"""

from __future__ import annotations

import dataclasses
import math

from opdflow.config import STAGES, PipelineConfig
from opdflow.errors import ConfigError
from opdflow.memory import engine, trace
from opdflow.memory.learner import Log, buckets, cached, learner_plan
from opdflow.memory.plan import GB, ActorPlan, GpuOf, MemoryPlan, Part
from opdflow.memory.shape import ModelShape, model_shape


def _prefill_bytes(
    cfg: PipelineConfig, shapes: list[ModelShape], rows: int, log: Log, what: str
) -> int:
    d, e = cfg.data, cfg.engine
    budget = cfg.train.micro_batch_tokens
    row = d.max_prompt_tokens + e.max_new_tokens
    mb_rows = max(1, min(rows, budget // row)) if budget else rows
    same = all(s.config == shapes[0].config for s in shapes)
    groups = [shapes] if same else [[s] for s in shapes]  # different shapes: traced apart
    total = 0
    for group in groups:
        key = {"kind": "prefill", "what": f"{what}, {mb_rows} x {row:,} tokens",
               "shape": group[0].config, "rows": mb_rows, "prompt": d.max_prompt_tokens,
               "response": e.max_new_tokens, "chunk": cfg.train.logit_chunk_tokens,
               "models": len(group)}  # fmt: skip
        result = cached(
            cfg, key,
            lambda g=group: {"prefill": trace.prefill(
                g[0], mb_rows, d.max_prompt_tokens, e.max_new_tokens,
                cfg.train.logit_chunk_tokens, len(g),
            )},
            log,
        )  # fmt: skip
        total += result["prefill"]["prefill"]
    return total


def scorer_plan(cfg: PipelineConfig, stage: str, shape: ModelShape, log: Log) -> ActorPlan:
    """The rescorer (BF16 student, follows the weights) or the teacher scorer."""
    d = cfg.data
    prefill = _prefill_bytes(cfg, [shape], d.prompts_per_step * d.responses_per_prompt, log, stage)
    parts = [
        Part("weights", shape.params() * 2.0, "BF16", f"resources.{stage}.num_gpus (now "
             f"{getattr(cfg.resources, stage).num_gpus:g}; a larger share)"),
        Part("prefill", prefill, "one micro-batch scored, no gradients",
             f"train.micro_batch_tokens (now {cfg.train.micro_batch_tokens:,}; lower)"),
        Part("CUDA context", engine.CONTEXT_BYTES, "assumed"),
    ]  # fmt: skip
    if stage == "rescorer" and (b := buckets(cfg, "received here")):
        parts.append(b)
    return ActorPlan(stage, getattr(cfg.resources, stage).num_gpus, parts=parts)


def _kv_notes(cfg: PipelineConfig, shape: ModelShape, mem: engine.EngineMemory, rows: int,
              tp: int, recipe: str, rows_are: str = "responses a step",
              ) -> tuple[list[str], list[tuple[str, str]]]:  # fmt: skip
    seq = cfg.data.max_prompt_tokens + cfg.engine.max_new_tokens
    _, kind = engine.kv_element_bytes(recipe, shape.layers)
    notes = [
        f"KV cache: {mem.kv_tokens:,} tokens at {kind} ({mem.kv_bytes_per_token / 1e3:.0f} kB a "
        f"token): {mem.kv_tokens // seq} sequences of {seq:,} tokens at once, for {rows} "
        f"{rows_are} (more wait their turn)"
    ]
    if recipe.split("+")[0] == "bf16" or "fp8_kv" not in recipe:
        fp8 = mem.kv_cache / shape.kv_bytes_per_token(1.0, tp)
        notes.append(f"engine.recipe with fp8_kv: {int(fp8):,} tokens (one byte an element)")
    problems = []
    if mem.kv_tokens < seq:
        problems.append((
            f"its KV cache holds {mem.kv_tokens:,} tokens, fewer than one {seq:,}-token "
            "sequence (data.max_prompt_tokens + engine.max_new_tokens): vLLM refuses to start",
            "a shorter sequence (data.max_prompt_tokens, engine.max_new_tokens)",
        ))  # fmt: skip
    return notes, problems


def generator_plan(cfg: PipelineConfig, shape: ModelShape, gpu: tuple[float, str] | None) -> ActorPlan:  # fmt: skip
    """One rollout replica, per GPU (per tensor-parallel shard)."""
    e, d, r = cfg.engine, cfg.data, cfg.resources
    rows = math.ceil(d.prompts_per_step * d.responses_per_prompt / e.replicas)
    if e.kind != "vllm":
        mem = engine.torch_engine(shape, rows, d.max_prompt_tokens + e.max_new_tokens)
        parts = [
            Part("weights", mem.weights, "BF16 student (TorchEngine)"),
            Part("KV cache", mem.kv_cache, f"{rows} rows at once",
                 f"engine.replicas (now {e.replicas}; more, fewer rows each)"),
            Part("logits, CUDA context", mem.reserve, "context assumed"),
        ]  # fmt: skip
        return ActorPlan("generator", r.generator.num_gpus, gpu, parts)
    tp = e.tensor_parallel_size
    share = e.gpu_memory_utilization * (gpu[0] if gpu else 0.0) * GB
    mem = engine.vllm(shape, tp, share, e.recipe)
    util = f"engine.gpu_memory_utilization (now {e.gpu_memory_utilization:g}"
    parts = [
        Part("weights", mem.weights, f"BF16, 1/{tp} (tensor-parallel shard)" if tp > 1 else "BF16",
             f"engine.tensor_parallel_size (now {tp}; more GPUs a replica)"),
        Part("runtime reserve", mem.reserve, f"vLLM's profiled forward ({engine.VLLM_BATCHED_TOKENS:,}"
             f" tokens), sampler ({engine.VLLM_MAX_SEQS} rows), CUDA graphs, context: assumed"),
    ]  # fmt: skip
    notes: list[str] = []
    problems: list[tuple[str, str]] = []
    if gpu is not None:
        parts.append(Part("KV cache", mem.kv_cache, "the rest of vLLM's share", util + "; lower)"))
        notes, problems = _kv_notes(cfg, shape, mem, rows, tp, e.recipe)
        problems = [
            (w, f"{util}; raise it), engine.tensor_parallel_size or {f}") for w, f in problems
        ]
    if b := buckets(cfg, "received here, outside vLLM's share"):
        parts.append(b)
    return ActorPlan("generator", r.generator.num_gpus / tp, gpu, parts, notes, problems)


def evaluator_plan(cfg: PipelineConfig, student: ModelShape, teacher: ModelShape,
                   gpu: tuple[float, str] | None, log: Log) -> ActorPlan:  # fmt: skip
    """The evaluator: its BF16 engine, the BF16 student and teacher that score, the prefill."""
    ev, d, e = cfg.eval, cfg.data, cfg.engine
    rows = ev.batch_prompts * ev.samples_per_prompt
    seq = d.max_prompt_tokens + e.max_new_tokens
    prefill = _prefill_bytes(cfg, [student, teacher], rows, log, "evaluator")
    mb = f"train.micro_batch_tokens (now {cfg.train.micro_batch_tokens:,}; lower)"
    parts: list[Part] = []
    notes: list[str] = []
    problems: list[tuple[str, str]] = []
    if e.kind == "vllm":
        util = f"eval.vllm_gpu_memory_utilization (now {ev.vllm_gpu_memory_utilization:g}"
        share = ev.vllm_gpu_memory_utilization * (gpu[0] if gpu else 0.0) * GB
        mem = engine.vllm(student, 1, share)
        parts += [
            Part("engine weights", mem.weights, "vLLM, BF16"),
            Part("engine reserve", mem.reserve, "vLLM's profiled forward, sampler, graphs, "
                 "context: assumed"),
        ]  # fmt: skip
        if gpu is not None:
            parts.append(
                Part("engine KV cache", mem.kv_cache, "the rest of vLLM's share", util + "; lower)")
            )
            notes, problems = _kv_notes(
                cfg, student, mem, rows, 1, "bf16", "held-out responses a batch"
            )
            notes = notes[:1]
            problems = [(w, f"{util}; raise it) or {f}") for w, f in problems]
        parts.append(Part("student weights", student.params() * 2.0, "BF16, scores"))
    else:
        mem = engine.torch_engine(student, rows, seq)
        parts += [
            Part("student weights", mem.weights, "BF16: samples (TorchEngine) and scores"),
            Part("KV cache", mem.kv_cache, f"{rows} rows at once", f"eval.batch_prompts (now {ev.batch_prompts}; lower)"),
            Part("logits, CUDA context", mem.reserve, "context assumed"),
        ]  # fmt: skip
    parts += [
        Part("teacher weights", teacher.params() * 2.0, "BF16, scores"),
        Part("prefill", prefill, "student and teacher on one micro-batch, exact KL", mb),
    ]
    if b := buckets(cfg, "received here"):
        parts.append(b)
    return ActorPlan("evaluator", cfg.resources.evaluator.num_gpus, gpu, parts, notes, problems)


def _tiny_shape(cfg: PipelineConfig) -> ModelShape:
    t = cfg.models.tiny
    return ModelShape(
        {"model_type": t.arch, "vocab_size": 64, "hidden_size": t.hidden_size,
         "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_layers,
         "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_kv_heads,
         "max_position_embeddings": 4096, "tie_word_embeddings": False},
        "models.tiny (vocabulary taken as 64: a bound)",
    )  # fmt: skip


def shapes(cfg: PipelineConfig) -> tuple[ModelShape, ModelShape]:
    """The student's and the teacher's shapes (the teacher: the student's where its own
    cannot be read, as the paper's teachers are RL-fine-tuned students)."""
    if cfg.models.student == "tiny":
        return _tiny_shape(cfg), _tiny_shape(cfg)
    student = model_shape(cfg.models.student, "models.student")
    try:
        teacher = model_shape(cfg.models.teacher, "models.teacher")
    except ConfigError:
        teacher = dataclasses.replace(
            student, source=f"the student's shape (no config.json at {cfg.models.teacher})"
        )
    return student, teacher


def plan_pipeline(cfg: PipelineConfig, gpu_of: GpuOf, log: Log | None = None) -> MemoryPlan:
    """The plan of every GPU actor of `cfg` (`gpu_of` gives each actor's GPU); actors of a
    stage on GPUs of one size share one plan. `log` hears what is being traced."""
    from opdflow.core.actor_name import actor_name

    log = log or (lambda _msg: None)
    r = cfg.resources
    gpu_stages = [s for s in STAGES if getattr(r, s).num_gpus > 0]
    if not gpu_stages:
        return MemoryPlan([])
    student, teacher = shapes(cfg)
    counts = {"learner": r.learner.workers,
              "generator": max(cfg.engine.replicas, cfg.engine.max_replicas or 0)}  # fmt: skip
    plans: list[ActorPlan] = []
    for stage in ("learner", "generator", "rescorer", "teacher", "evaluator"):
        if stage not in gpu_stages:
            continue
        n = counts.get(stage, 1)
        names = [actor_name(stage, i, n) for i in range(n)]
        groups: dict[tuple | None, list[str]] = {}
        for name in names:
            groups.setdefault(gpu_of(name), []).append(name)
        base = None
        for gpu, members in groups.items():
            if stage == "learner":
                base = base or learner_plan(cfg, student, True, log)
                plan = dataclasses.replace(base, gpu=gpu)
            elif stage == "generator":
                plan = generator_plan(cfg, student, gpu)
            elif stage in ("rescorer", "teacher"):
                base = base or scorer_plan(
                    cfg, stage, student if stage == "rescorer" else teacher, log
                )
                plan = dataclasses.replace(base, gpu=gpu)
            else:
                plan = evaluator_plan(cfg, student, teacher, gpu, log)
            plan.actor = _label(stage, members, n)
            plans.append(plan)
    sources = [f"student: {student.source}", f"teacher: {teacher.source}"]
    return MemoryPlan(plans, sources)


def _label(stage: str, members: list[str], count: int) -> str:
    if len(members) == 1:
        return members[0]
    first, last = (m.split("[")[-1].rstrip("]") for m in (members[0], members[-1]))
    span = f"{first}-{last}" if len(members) == int(last) - int(first) + 1 else ",".join(
        m.split("[")[-1].rstrip("]") for m in members)  # fmt: skip
    return f"{stage}[{span}]"
