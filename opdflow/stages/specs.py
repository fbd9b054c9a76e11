"""Stage specs: what each stage actor is built from, one frozen config per actor kind.

A run makes them once from its pipeline config and the inputs the session resolved
(`StageSpecs.of`): the model paths, the torch threads, the engine and scoring settings.
Each actor takes its spec as its one argument (the learner's ranks add where they stand in
the group), so an actor's settings are named and typed, and a test or a bench builds an
actor the way a run does. Ray's options for an actor (resources, restarts, its placement
bundle) are not here: they are `Placement.options(stage)` (cluster/placement.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opdflow.config import LearnerResources, PipelineConfig, TrainConfig

if TYPE_CHECKING:
    from opdflow.inputs.models import ResolvedModels
    from opdflow.weights.transport import Transport


@dataclass(frozen=True)
class GeneratorSpec:
    """One rollout engine replica (GeneratorWorker)."""

    model: str
    """The student checkpoint the engine samples from."""
    pad_id: int
    """The tokenizer's padding token."""
    eos_id: int
    """The tokenizer's end-of-sequence token."""
    kind: str = "torch"
    """engine.kind: "torch" or "vllm"."""
    recipe: str = "bf16"
    """engine.recipe: the engine configuration c (core/recipe.py)."""
    threads: int = 1
    """resources.generator.torch_threads."""
    tokenizer: str | None = None
    """With a tokenizer, batches carry the 0/1 correctness reward (None: no reward)."""
    grader: str = "exact"
    """data.grader: how a response is graded against its answer."""
    grader_timeout_s: float = 5.0
    """data.grader_timeout_s."""
    tensor_parallel_size: int = 1
    """vLLM only: engine.tensor_parallel_size."""
    max_model_len: int | None = None
    """vLLM only: the longest prompt + response (data.max_prompt_tokens +
    engine.max_new_tokens); None: the model's context."""
    gpu_memory_utilization: float = 0.9
    """vLLM only: engine.gpu_memory_utilization."""

    def vllm_options(self) -> dict[str, Any]:
        """VLLMEngine keywords beyond the model, tokens and recipe."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }


@dataclass(frozen=True)
class RescorerSpec:
    """The BF16 student that rescores the engine's tokens (RescorerActor)."""

    model: str
    """The student checkpoint."""
    threads: int = 1
    """resources.rescorer.torch_threads."""
    temperature: float = 1.0
    """engine.temperature: the distribution the engine sampled from."""
    chunk_tokens: int = TrainConfig.logit_chunk_tokens
    """train.logit_chunk_tokens: logits computed this many tokens at a time."""
    micro_batch_tokens: int = 0
    """train.micro_batch_tokens: tokens per forward pass (0: the whole batch)."""


@dataclass(frozen=True)
class TeacherSpec:
    """The fixed teacher that scores the student's tokens (TeacherActor)."""

    model: str
    """The teacher checkpoint."""
    threads: int = 1
    """resources.teacher.torch_threads."""
    chunk_tokens: int = TrainConfig.logit_chunk_tokens
    """train.logit_chunk_tokens."""
    micro_batch_tokens: int = 0
    """train.micro_batch_tokens."""


@dataclass(frozen=True)
class EvaluatorSpec:
    """The held-out evaluator: a standard BF16 engine and the teacher (EvaluatorActor)."""

    student: str
    """The student checkpoint (its weights follow the versions evaluated)."""
    teacher: str
    """The teacher checkpoint."""
    tokenizer: str
    """The tokenizer the responses are decoded and graded with."""
    threads: int = 1
    """resources.evaluator.torch_threads."""
    chunk_tokens: int = TrainConfig.logit_chunk_tokens
    """train.logit_chunk_tokens."""
    micro_batch_tokens: int = 0
    """train.micro_batch_tokens."""
    batch_prompts: int = 64
    """eval.batch_prompts: prompts generated at a time."""
    engine_kind: str = "torch"
    """engine.kind: which engine samples the held-out responses (at BF16)."""
    grader: str = "exact"
    """data.grader."""
    grader_timeout_s: float = 5.0
    """data.grader_timeout_s."""
    vllm_gpu_memory_utilization: float = 0.4
    """eval.vllm_gpu_memory_utilization (vLLM only)."""
    max_model_len: int | None = None
    """The longest prompt + response (vLLM only)."""
    keep_texts: bool = False
    """eval.save_responses: return every response with its grade."""

    def evaluator_options(self) -> dict[str, Any]:
        """Evaluator's keyword-only settings."""
        names = ("engine_kind", "grader", "grader_timeout_s", "vllm_gpu_memory_utilization",
                 "keep_texts", "max_model_len")  # fmt: skip
        return {n: getattr(self, n) for n in names}


@dataclass(frozen=True)
class LearnerSpec:
    """The learner, every rank of it (LearnerActor)."""

    model: str
    """The student checkpoint it starts from."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The optimizer, loss and micro-batching."""
    seed: int = 0
    """The run's seed."""
    resources: LearnerResources = field(default_factory=LearnerResources)
    """Its torch threads and its ranks (workers)."""
    transport: Transport | None = None
    """How its versions move (weights/transport.py, parsed from weights.*); None: the
    object store."""

    def with_workers(self, workers: int) -> LearnerSpec:
        """The same learner on `workers` ranks (a group that healed onto fewer)."""
        return dataclasses.replace(
            self, resources=dataclasses.replace(self.resources, workers=workers)
        )


@dataclass(frozen=True)
class StageSpecs:
    """One spec per actor kind of a run."""

    generator: GeneratorSpec
    rescorer: RescorerSpec
    teacher: TeacherSpec
    evaluator: EvaluatorSpec
    learner: LearnerSpec

    @classmethod
    def of(cls, cfg: PipelineConfig, models: ResolvedModels, tokenizer: Any) -> StageSpecs:
        """Every actor's spec from the pipeline config, the resolved model paths and the
        loaded tokenizer (its padding and end tokens)."""
        from opdflow.weights.transport import for_pipeline

        r, e, d, t = cfg.resources, cfg.engine, cfg.data, cfg.train
        scoring = {"chunk_tokens": t.logit_chunk_tokens, "micro_batch_tokens": t.micro_batch_tokens}
        grading = {"grader": d.grader, "grader_timeout_s": d.grader_timeout_s}
        longest = d.max_prompt_tokens + e.max_new_tokens  # vLLM's max_model_len
        generator = GeneratorSpec(
            model=models.student,
            pad_id=tokenizer.pad_token_id,
            eos_id=tokenizer.eos_token_id,
            kind=e.kind,
            recipe=e.recipe,
            threads=r.generator.torch_threads,
            tokenizer=models.tokenizer,
            tensor_parallel_size=e.tensor_parallel_size,
            max_model_len=longest,
            gpu_memory_utilization=e.gpu_memory_utilization,
            **grading,
        )
        evaluator = EvaluatorSpec(
            student=models.student,
            teacher=models.teacher,
            tokenizer=models.tokenizer,
            threads=r.evaluator.torch_threads,
            batch_prompts=cfg.eval.batch_prompts,
            engine_kind=e.kind,
            vllm_gpu_memory_utilization=cfg.eval.vllm_gpu_memory_utilization,
            max_model_len=longest,
            keep_texts=cfg.eval.save_responses,
            **scoring,
            **grading,
        )
        return cls(
            generator=generator,
            rescorer=RescorerSpec(
                models.student, r.rescorer.torch_threads, e.temperature, **scoring
            ),
            teacher=TeacherSpec(models.teacher, r.teacher.torch_threads, **scoring),
            evaluator=evaluator,
            learner=LearnerSpec(models.student, t, cfg.seed, r.learner, for_pipeline(cfg)),
        )
