"""Pipeline configuration: dataclasses validated at load, with errors that name the field.

A pipeline file is plain Python whose function returns one `PipelineConfig`; variants are
more functions. Everything a run needs is here, so a run directory's `config.json` fully
describes it and `--set a.b=v` overrides reach every field. Nothing heavy is imported.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opdflow.errors import ConfigError


def _fail(path: str, value: Any, expected: str) -> typing.NoReturn:
    raise ConfigError(f"{path} = {value!r} is not allowed: expected {expected}")


@dataclass
class TinyModelSpec:
    """How the embedded tiny teacher and student are built (a change rebuilds them)."""

    arch: str = "qwen2"
    """Architecture: "qwen2" (q/k/v bias, like DeepSeek-R1-Distill-Qwen) or "llama"."""
    hidden_size: int = 128
    """Model width. hidden_size / num_heads must be >= 32 so vLLM's CPU build can run it."""
    num_layers: int = 3
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 512
    """MLP width."""
    teacher_steps: int = 1200
    """Supervised steps on the task for the teacher (the last checkpoint)."""
    student: str = "checkpoint"
    """How the student is made: "checkpoint" (an earlier checkpoint of the teacher's run, by
    student_accuracy) or "carry_blind" (the teacher fine-tuned to drop carries on a share of
    problems: close to the teacher in weights, wrong on a skill OPD can teach it, like the
    paper's student and its RL-improved teacher; needs data.task.worked)."""
    student_accuracy: float = 0.3
    """"checkpoint": the student is the first earlier checkpoint (checked every 25 steps) whose
    held-out greedy accuracy reaches this share: a clearly weaker model from the same run."""
    carry_blind_share: float = 0.75
    """"carry_blind": share of fine-tuning targets whose carries are dropped (the rest are
    right), so the student still samples a right carry now and then."""
    carry_blind_steps: int = 30
    """"carry_blind": fine-tuning steps from the teacher (batch_size examples each)."""
    carry_blind_lr: float = 1e-3
    """"carry_blind": constant AdamW learning rate of the fine-tuning."""
    batch_size: int = 128
    """Supervised batch size, in examples."""
    lr: float = 3e-3
    """Supervised AdamW peak learning rate (warm-up, then cosine decay to 10%)."""
    label_smoothing: float = 0.1
    """Supervised label smoothing: keeps the teacher's log-probabilities of wrong tokens finite
    (about log(0.1 / vocab)) like a real LLM's, instead of -20 nats, so OPD advantages stay sane."""
    key_bias_layer0: float = 0.0
    """Planted sensitivity: add this constant to layer 0's key-projection bias on the slowest
    rotary dimensions of every key head (zoo.planted_key_dims; 0 = none): large keys an FP8
    KV cache rounds badly, which attention itself hardly notices."""
    seed: int = 0
    """Seed of initialisation and supervised data order."""
    portable_kernels: bool = False
    """Build with pinned float kernels (zoo.PINNED_KERNELS: ATen's AVX2 kernels, MKL's
    COMPATIBLE branch, 2 threads), so this recipe gives the same weights, byte for byte, on
    every x86-64 CPU with AVX2, Intel or AMD (its own cache key). Off by default: MKL's only
    vendor-independent branch is SSE2 code, about 3x the build time (the demo's: 44 s -> 122 s
    on a 2-core Xeon with AMX); a default build is reproducible per CPU type only."""

    def validate(self, path: str) -> None:
        _one_of(f"{path}.arch", self.arch, ("qwen2", "llama"))
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            _positive(f"{path}.{name}", getattr(self, name))
        _positive(f"{path}.intermediate_size", self.intermediate_size)
        _positive(f"{path}.teacher_steps", self.teacher_steps)
        _one_of(f"{path}.student", self.student, ("checkpoint", "carry_blind"))
        if not 0.0 < self.student_accuracy < 1.0:
            _fail(f"{path}.student_accuracy", self.student_accuracy, "a share in (0, 1)")
        if not 0.0 < self.carry_blind_share <= 1.0:
            _fail(f"{path}.carry_blind_share", self.carry_blind_share, "a share in (0, 1]")
        _positive(f"{path}.carry_blind_steps", self.carry_blind_steps)
        _positive(f"{path}.carry_blind_lr", self.carry_blind_lr)
        _positive(f"{path}.batch_size", self.batch_size)
        _positive(f"{path}.lr", self.lr)
        if not 0.0 <= self.label_smoothing < 1.0:
            _fail(f"{path}.label_smoothing", self.label_smoothing, "a share in [0, 1)")
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            _fail(
                f"{path}.hidden_size",
                self.hidden_size,
                f"a multiple of num_heads={self.num_heads} with head size >= 32 "
                f"(e.g. hidden_size={32 * self.num_heads})",
            )
        if self.num_heads % self.num_kv_heads:
            _fail(
                f"{path}.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of num_heads={self.num_heads}",
            )


@dataclass
class ModelsConfig:
    """Which student and teacher to use."""

    student: str = "tiny"
    """"tiny" (built and cached locally) or a local Hugging Face checkpoint directory."""
    teacher: str = "tiny"
    """"tiny" or a local Hugging Face checkpoint directory; must share the student's tokenizer."""
    tiny: TinyModelSpec = field(default_factory=TinyModelSpec)
    """Recipe of the tiny models, used where student or teacher is "tiny"."""
    cache_dir: str | None = None
    """Where tiny models and data are cached; default $OPDFLOW_CACHE or ~/.cache/opdflow."""

    def validate(self, path: str) -> None:
        self.tiny.validate(f"{path}.tiny")
        if (self.student == "tiny") != (self.teacher == "tiny"):
            _fail(
                f"{path}.teacher",
                self.teacher,
                'both student and teacher "tiny", or both local checkpoint directories',
            )


@dataclass
class TaskSpec:
    """The synthetic arithmetic task with checkable answers (used where data is "tiny")."""

    digits: int = 3
    """Digits per operand (zero-padded), e.g. 3 gives "Q:123+045="."""
    worked: bool = False
    """Responses write out every column (digits, carry in, two-digit sum) before the answer,
    about 30 tokens at 3 digits (engine.max_new_tokens >= 32); False: the bare answer."""
    num_train: int = 20000
    """Training prompts written to the cached parquet."""
    num_heldout: int = 256
    """Held-out prompts written to the cached parquet (disjoint from training)."""

    def validate(self, path: str) -> None:
        _in_range(f"{path}.digits", self.digits, 1, 6)
        _positive(f"{path}.num_train", self.num_train)
        _positive(f"{path}.num_heldout", self.num_heldout)


@dataclass
class DataConfig:
    """Prompts for training and the held-out quality metric."""

    train: str = "tiny"
    """"tiny" or a parquet file: a `prompt` column (string or chat-message list)."""
    heldout: str = "tiny"
    """"tiny" or a parquet file with the same schema; fixed across runs for paired stats."""
    task: TaskSpec = field(default_factory=TaskSpec)
    """The synthetic task, used where train or heldout is "tiny"."""
    prompts_per_step: int = 8
    """Prompts per training step (the paper: 8)."""
    responses_per_prompt: int = 8
    """Responses sampled per prompt (the paper: 8)."""
    max_prompt_tokens: int = 512
    """Longer prompts are refused at load with the file and row named."""
    grader: str = "exact"
    """How a response's answer is checked against the reference, for held-out accuracy and
    the RL baselines' reward: "exact" (the tiny task: the text after the last ':' equals the
    answer) or "math" (math-verify: the response's \\boxed{} or last answer equals the
    ground truth as mathematics, so 1/2, 0.5 and \\frac{1}{2} agree; DAPO-Math-17k, AIME,
    MATH-500). With "math" every row of data.train and data.heldout needs a ground truth
    math-verify can parse, checked at start (the error names the file, row and column)."""
    grader_timeout_s: float = 5.0
    """Seconds the "math" grader may spend on one answer (parsing and comparison); an answer
    that takes longer counts as wrong."""

    def validate(self, path: str) -> None:
        self.task.validate(f"{path}.task")
        _positive(f"{path}.prompts_per_step", self.prompts_per_step)
        _positive(f"{path}.responses_per_prompt", self.responses_per_prompt)
        _positive(f"{path}.max_prompt_tokens", self.max_prompt_tokens)
        _one_of(f"{path}.grader", self.grader, ("exact", "math"))
        _positive(f"{path}.grader_timeout_s", self.grader_timeout_s)


@dataclass
class EngineConfig:
    """The rollout engine: the configuration c whose mismatch the study measures."""

    kind: str = "torch"
    """"torch" (TorchEngine, runs anywhere) or "vllm" (pip install opdflow[vllm])."""
    recipe: str = "bf16"
    """Precision recipe of the rollout engine, e.g. "bf16", "fp8", "noise(0.15)"."""
    replicas: int = 1
    """Generator actors in the pool at the start."""
    min_replicas: int | None = None
    """Fewest generator actors the pool shrinks to (None = replicas: a fixed-size pool)."""
    max_replicas: int | None = None
    """Most generator actors the pool grows to when the scheduler asks for more generation or
    queued work exceeds the ready replicas (None = replicas). On a cluster, replicas beyond
    the running nodes stay pending until the Ray autoscaler adds a node for them."""
    scale_down_idle_s: float = 30.0
    """Grace period, in seconds: a replica is retired (down to min_replicas) once, over the
    last this-many seconds, the other replicas could have done all the generation at most
    70% busy; it finishes its in-flight work first. Also the minimum time between resizes."""
    temperature: float = 1.0
    """Sampling temperature; logprobs are those of the distribution actually sampled from."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    max_new_tokens: int = 8
    """Response length cap, in tokens."""
    exact_kl_max_vocab: int = 4096
    """Compute exact full-vocabulary KL when the vocabulary is at most this large."""
    tensor_parallel_size: int = 1
    """engine.kind = "vllm": GPUs one replica spans with tensor parallelism (one placement
    bundle of that many GPUs on one node: resources.generator.num_gpus must equal it). GPUs
    only; 1 on vLLM's CPU build."""
    gpu_memory_utilization: float = 0.9
    """engine.kind = "vllm" on GPUs: share of each of its GPUs a replica's vLLM may take
    (weights, activations, CUDA graphs and KV cache). No effect on the CPU build."""

    def validate(self, path: str) -> None:
        _one_of(f"{path}.kind", self.kind, ("torch", "vllm"))
        _positive(f"{path}.replicas", self.replicas)
        lo = self.replicas if self.min_replicas is None else self.min_replicas
        hi = self.replicas if self.max_replicas is None else self.max_replicas
        if isinstance(lo, int) and not 1 <= lo <= self.replicas:
            _fail(f"{path}.min_replicas", lo, f"an integer in [1, replicas={self.replicas}]")
        if isinstance(hi, int) and hi < self.replicas:
            _fail(f"{path}.max_replicas", hi, f"an integer >= replicas={self.replicas}")
        _positive(f"{path}.scale_down_idle_s", self.scale_down_idle_s)
        _positive(f"{path}.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            _fail(f"{path}.top_p", self.top_p, "a number in (0, 1]")
        _positive(f"{path}.max_new_tokens", self.max_new_tokens)
        _in_range(f"{path}.tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        if self.tensor_parallel_size > 1 and self.kind != "vllm":
            _fail(
                f"{path}.tensor_parallel_size",
                self.tensor_parallel_size,
                "1 unless engine.kind = 'vllm' (TorchEngine runs on one device)",
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            _fail(
                f"{path}.gpu_memory_utilization", self.gpu_memory_utilization, "a share in (0, 1]"
            )
        if not isinstance(self.recipe, str) or not self.recipe.strip():
            _fail(f"{path}.recipe", self.recipe, 'a recipe name such as "bf16"')
        from opdflow.core.recipe import parse_recipe

        try:
            parse_recipe(self.recipe)
        except ConfigError as exc:
            raise ConfigError(f"{path}.recipe: {exc}") from exc


@dataclass
class TrainConfig:
    """The learner: optimiser and objective."""

    steps: int = 40
    """Learner steps (weight versions produced)."""
    lr: float = 1e-4
    """AdamW learning rate (after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps (0 = none): AdamW's first updates
    move every weight by about lr whatever its gradient, which knocks a student off course."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 = off)."""
    loss: str = "opd"
    """"opd" (teacher-student log ratio advantage), or the RL baselines "reinforce", "grpo"."""
    advantage_from: str = "learner"
    """Whose logprob the OPD advantage subtracts: "learner" (default) or "engine"."""
    is_clip: float = 0.0
    """Truncated importance weight min(exp(logp_learner - logp_engine), C); 0 = off."""
    center_advantage: bool = False
    """Subtract the batch-mean advantage (score centering)."""
    max_bad_steps: int = 3
    """Steps with a NaN/inf loss are skipped; the run stops after this many."""
    logit_chunk_tokens: int = 1024
    """Response tokens whose full-vocabulary logits exist at once when the learner, rescorer,
    teacher and evaluator score tokens (logp, entropy, exact KL and their gradient): memory
    ~ this x vocabulary x 4 bytes x a few (1024 x 150k vocab: ~0.6 GB per copy), never the
    whole batch's B x T x vocabulary."""
    micro_batch_tokens: int = 16384
    """Token budget of one forward, in padded tokens (rows x (widest prompt + widest
    response)): the learner packs a step's responses into micro-batches of at most this many
    and accumulates their gradients (normalised by the whole step's tokens: the same
    gradient as one full-batch step); the rescorer, the teacher and the evaluator's prefill
    use the same budget. Memory follows this, not the batch. At least
    data.max_prompt_tokens + engine.max_new_tokens (a response is never split); 0 = the
    whole batch in one forward."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them:
    the learner's activation memory drops to one layer's plus each layer's input, for about
    a third more compute."""
    compute_dtype: str = "auto"
    """The sharded (FSDP2) learner's compute dtype: parameters all-gathered and matmuls run
    in it, while master weights, gradients' reduction and AdamW stay FP32. "auto" =
    "bfloat16" on GPUs, "float32" on CPUs (where bf16 matmuls are emulated on many CPUs and a
    data-parallel learner then matches one worker only to bf16 precision)."""

    def validate(self, path: str) -> None:
        _positive(f"{path}.steps", self.steps)
        _positive(f"{path}.lr", self.lr)
        _nonnegative(f"{path}.weight_decay", self.weight_decay)
        _nonnegative(f"{path}.grad_clip", self.grad_clip)
        _one_of(f"{path}.loss", self.loss, ("opd", "reinforce", "grpo"))
        _one_of(f"{path}.advantage_from", self.advantage_from, ("learner", "engine"))
        _nonnegative(f"{path}.is_clip", self.is_clip)
        _nonnegative(f"{path}.max_bad_steps", self.max_bad_steps)
        _nonnegative(f"{path}.warmup_steps", self.warmup_steps)
        _in_range(f"{path}.logit_chunk_tokens", self.logit_chunk_tokens, 1, 2**31 - 1)
        _in_range(f"{path}.micro_batch_tokens", self.micro_batch_tokens, 0, 2**31 - 1)
        _one_of(f"{path}.compute_dtype", self.compute_dtype, ("auto", "bfloat16", "float32"))


@dataclass
class StalenessConfig:
    """How many versions old rollout weights may be: step n trains on version v iff n - v <= k."""

    policy: str = "fixed"
    """"fixed" (k below) or "adaptive" (tunes k in [0, k_max] to keep the trainer busy)."""
    k: int = 2
    """Fixed staleness bound; 0 = synchronous. The adaptive policy's starting k."""
    k_max: int = 8
    """Adaptive policy: largest k it may choose."""
    target_wait_share: float = 0.02
    """Adaptive policy: trainer wait as a share of step time it aims to stay under."""
    budget_nats: float = 0.0
    """Adaptive policy: d_stale (nats/token) it may never exceed; 0 = no budget."""

    def validate(self, path: str) -> None:
        _one_of(f"{path}.policy", self.policy, ("fixed", "adaptive"))
        _nonnegative(f"{path}.k", self.k)
        _nonnegative(f"{path}.k_max", self.k_max)
        if self.policy == "adaptive" and self.k > self.k_max:
            _fail(f"{path}.k", self.k, f"at most k_max={self.k_max}")
        if not 0.0 < self.target_wait_share < 1.0:
            _fail(f"{path}.target_wait_share", self.target_wait_share, "a share in (0, 1)")
        _nonnegative(f"{path}.budget_nats", self.budget_nats)


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
        _positive(f"{path}.every", self.every)
        _positive(f"{path}.prompts", self.prompts)
        _positive(f"{path}.samples_per_prompt", self.samples_per_prompt)
        _in_range(f"{path}.batch_prompts", self.batch_prompts, 1, 2**31 - 1)
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            _fail(
                f"{path}.vllm_gpu_memory_utilization",
                self.vllm_gpu_memory_utilization,
                "a share in (0, 1]",
            )


@dataclass
class ReliabilityConfig:
    """Faults survived, checkpoints written."""

    checkpoint_every: int = 10
    """Write a checkpoint every this many learner steps (and on a clean stop); 0 = only on stop."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted after a newer one is complete)."""
    stage_timeout_s: float = 300.0
    """A batch not ready this many seconds after the trainer starts waiting for it: the stage
    holding it is treated as dead (its actor is killed and restarted, its work re-issued)."""
    startup_timeout_s: float = 600.0
    """Every stage actor must be running this many seconds after the run starts; actors Ray
    cannot place (too few CPUs/GPUs/custom resources) end the run with an error then."""
    max_restarts: int = 3
    """Restarts allowed per generator/rescorer/teacher/evaluator actor before the run stops."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (step_NNNNNN/ and `latest`); None = <run_dir>/checkpoints. Every
    learner worker writes its own shards there and the driver commits them, so on a cluster
    it must be storage every learner node and the driver's node share (NFS, Lustre, a
    mounted bucket): a run whose learner cannot see it is refused at start."""

    def validate(self, path: str) -> None:
        _nonnegative(f"{path}.checkpoint_every", self.checkpoint_every)
        _positive(f"{path}.keep_checkpoints", self.keep_checkpoints)
        _positive(f"{path}.stage_timeout_s", self.stage_timeout_s)
        _positive(f"{path}.startup_timeout_s", self.startup_timeout_s)
        _nonnegative(f"{path}.max_restarts", self.max_restarts)


@dataclass
class WeightsConfig:
    """How each new weights version moves from the learner to the generators, the rescorer
    and the evaluator. Either way a version is an ObjectRef the controller holds (at most
    k + 2 live) and the learner's step waits only for its FP32 -> BF16 cast."""

    transport: str = "auto"
    """"object_store": the cast buffer is put in Ray's object store by a learner thread
    while the next step trains; consumers load zero-copy views of it. "collective": the
    learner keeps the version (on its GPU) and each consumer receives it on its own 2-rank
    torch.distributed group with the learner (NCCL between GPUs, gloo on CPUs), so on GPUs
    nothing goes through host memory. "auto": collective when the learner and every consumer
    (generator, rescorer, evaluator) have a GPU, else object_store."""
    timeout_s: float = 300.0
    """collective: a consumer's pair setup or one version's receive that takes longer fails
    its fetch (the stage's work then fails like any stage error)."""

    def validate(self, path: str) -> None:
        _one_of(f"{path}.transport", self.transport, ("auto", "object_store", "collective"))
        _positive(f"{path}.timeout_s", self.timeout_s)


@dataclass
class StageResources:
    """Ray resources of one stage's actors."""

    num_cpus: float = 1.0
    """Logical CPUs reserved per actor."""
    num_gpus: float = 0.0
    """GPUs per actor."""
    torch_threads: int = 1
    """torch intra-op threads inside the actor (pinned so stages do not fight for cores)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources, e.g. {"rollout": 1} to place on rollout nodes."""

    def validate(self, path: str) -> None:
        _nonnegative(f"{path}.num_cpus", self.num_cpus)
        _nonnegative(f"{path}.num_gpus", self.num_gpus)
        _positive(f"{path}.torch_threads", self.torch_threads)


@dataclass
class LearnerResources(StageResources):
    """Ray resources of the learner: each of its `workers` actors gets num_cpus/num_gpus."""

    workers: int = 1
    """Learner actors (ranks), one GPU each where it has GPUs; they may span nodes. The
    student is sharded with FSDP2 over them (parameters, gradients and AdamW state split N
    ways, built on the meta device and loaded shard by shard) whenever N > 1 or the learner
    has a GPU; one CPU worker trains an unsharded FP32 model. The step's micro-batches are
    dealt to the ranks: loss and weights equal one worker's within float tolerance, and a
    sharded checkpoint from N workers resumes on any M."""

    def validate(self, path: str) -> None:
        super().validate(path)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            _fail(f"{path}.workers", self.workers, "an integer >= 1 (1 = a single learner actor)")


def _light() -> StageResources:
    return StageResources(num_cpus=0.0)


STAGES = ("generator", "learner", "rescorer", "teacher", "evaluator")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class PlacementConfig:
    """Ray placement groups: stages whose actors are reserved together, packed or spread."""

    groups: list[list[str]] = field(default_factory=list)
    """Each a list of stage names (generator, learner, rescorer, teacher, evaluator) whose
    actors get one placement group, one bundle per actor (the generator: one per starting
    replica; replicas the pool adds later are placed outside it). [] = no placement groups."""
    strategy: str = "PACK"
    """Ray strategy of every group: PACK, SPREAD, STRICT_PACK (one node) or STRICT_SPREAD."""

    def validate(self, path: str) -> None:
        _one_of(f"{path}.strategy", self.strategy, STRATEGIES)
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            if not isinstance(group, list) or not group:
                _fail(f"{path}.groups[{i}]", group, "a non-empty list of stage names")
            for stage in group:
                _one_of(f"{path}.groups[{i}]", stage, STAGES)
                if stage in seen:
                    _fail(
                        f"{path}.groups[{i}]", group, f"each stage in one group ({stage!r} twice)"
                    )
                seen.add(stage)


@dataclass
class ResourcesConfig:
    """Resources per stage."""

    generator: StageResources = field(default_factory=StageResources)
    """Each rollout engine replica."""
    learner: LearnerResources = field(default_factory=LearnerResources)
    """The learner (per worker; `workers` of them)."""
    rescorer: StageResources = field(default_factory=_light)
    """The BF16 rescorer."""
    teacher: StageResources = field(default_factory=_light)
    """The teacher scorer."""
    evaluator: StageResources = field(default_factory=_light)
    """The held-out evaluator."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Placement groups for stages that must share a node or be spread."""

    def validate(self, path: str) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f"{path}.{f.name}")


@dataclass
class LoggingConfig:
    """Where per-step metrics go besides the run directory's metrics.parquet (always written)."""

    sinks: list[str] = field(default_factory=list)
    """Extra trackers, any of "tensorboard", "wandb", "mlflow" (each an extra: pip install
    'opdflow[wandb]'); metric names are the metrics.parquet columns. CLI: --log wandb,mlflow."""
    project: str = "opdflow"
    """W&B project and MLflow experiment the run is logged under."""
    wandb_entity: str | None = None
    """W&B entity (user or team); None = your default entity."""
    wandb_mode: str | None = None
    """W&B mode: "online", "offline" (files under the run directory) or "disabled";
    None = $WANDB_MODE or wandb's default."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI, e.g. "http://mlflow:5000" or "sqlite:////abs/mlflow.db";
    None = $MLFLOW_TRACKING_URI, else sqlite:///<run_dir>/mlflow.db. A file store (file:// or
    a plain path) is refused: MLflow 3 keeps it in maintenance mode."""
    tensorboard_dir: str | None = None
    """TensorBoard event directory; None = <run_dir>/tensorboard."""

    def validate(self, path: str) -> None:
        for i, sink in enumerate(self.sinks):
            _one_of(f"{path}.sinks[{i}]", sink, ("parquet", "tensorboard", "wandb", "mlflow"))
        if self.wandb_mode is not None:
            _one_of(f"{path}.wandb_mode", self.wandb_mode, ("online", "offline", "disabled"))
        if not isinstance(self.project, str) or not self.project.strip():
            _fail(f"{path}.project", self.project, "a non-empty name")


@dataclass
class PipelineConfig:
    """One OPD run: student, teacher, data, rollout engine, staleness, steps."""

    name: str = "opd"
    """Run name, used in the run directory's name."""
    seed: int = 0
    """Seed of data order, sampling and initialisation of the learner."""
    run_dir: str | None = None
    """Run directory; default runs/<name>-<timestamp>."""
    warmup_steps: int = 2
    """Steps excluded from updates/hour (actor start, first weight fetch)."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """Student and teacher."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Rollout engine."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Learner."""
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    """Staleness bound and policy."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out KL."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """Ray resources per stage."""
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    """Fault handling and checkpoints."""
    log: LoggingConfig = field(default_factory=LoggingConfig)
    """Trackers fed once per step (metrics.parquet always; TensorBoard, W&B, MLflow on request)."""
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    """How weights versions reach the consumers (object store or a collective)."""

    def validate(self) -> PipelineConfig:
        if (
            not isinstance(self.name, str)
            or not self.name.replace("-", "").replace("_", "").isalnum()
        ):
            _fail("name", self.name, "letters, digits, '-' and '_'")
        _nonnegative("warmup_steps", self.warmup_steps)
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if dataclasses.is_dataclass(sub):
                sub.validate(f.name)
        row = self.data.max_prompt_tokens + self.engine.max_new_tokens
        if 0 < self.train.micro_batch_tokens < row:
            _fail(
                "train.micro_batch_tokens",
                self.train.micro_batch_tokens,
                f">= data.max_prompt_tokens + engine.max_new_tokens = {row} (a response is "
                "never split across micro-batches), or 0 for the whole batch in one forward",
            )
        r = self.resources
        consumers = {n: getattr(r, n).num_gpus for n in ("generator", "rescorer", "evaluator")}
        if self.weights.transport == "collective" and r.learner.num_gpus > 0:
            cpu = [n for n, g in consumers.items() if not g > 0]
            if cpu:
                _fail("weights.transport", "collective",
                      f"'object_store' or 'auto': the learner has a GPU, so the collective is "
                      f"NCCL, which needs every consumer on a GPU too ({', '.join(cpu)} "
                      "have none)")  # fmt: skip
        if self.models.tiny.student == "carry_blind" and not self.data.task.worked:
            _fail("models.tiny.student", "carry_blind", "'checkpoint' unless data.task.worked=true")
        _check_types(self, "")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        return _from_dict(cls, data, "").validate()


# ---------------------------------------------------------------- validation helpers


def _one_of(path: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        hint = difflib.get_close_matches(str(value), allowed, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        _fail(path, value, "one of " + ", ".join(repr(a) for a in allowed) + extra)


def _positive(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        _fail(path, value, "a number > 0")


def _nonnegative(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        _fail(path, value, "a number >= 0")


def _in_range(path: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        _fail(path, value, f"an integer in [{lo}, {hi}]")


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_types(obj: Any, prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_types(value, path + ".")
        elif not _type_ok(value, hints[f.name]):
            _fail(path, value, f"a value of type {_type_name(hints[f.name])}")


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _unknown(path: str, name: str, cls: type) -> typing.NoReturn:
    names = [f.name for f in dataclasses.fields(cls)]
    hint = difflib.get_close_matches(name, names, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ConfigError(
        f"unknown config field {path + name!r}{extra} (fields of {cls.__name__}: {', '.join(names)})"
    )


def _from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            _unknown(prefix, key, cls)
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = _from_dict(hint, value, f"{prefix}{key}.")
        kwargs[key] = value
    return cls(**kwargs)


# ---------------------------------------------------------------- overrides


def _coerce(text: str, hint: Any, path: str) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null"):
            return None
        hint = args[0]
    try:
        if hint is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(text)
        if hint is float:
            return float(text)
        if typing.get_origin(hint) in (dict, list):
            return json.loads(text)
        return text
    except ValueError:
        _fail(path, text, f"a value of type {_type_name(hint)}")


def apply_overrides(cfg: PipelineConfig, overrides: list[str]) -> PipelineConfig:
    """Apply `a.b=value` strings (the CLI's --set) in place, then validate."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set train.lr=3e-4")
        key, text = item.split("=", 1)
        obj: Any = cfg
        parts = key.strip().split(".")
        for i, part in enumerate(parts):
            prefix = ".".join(parts[:i])
            prefix = prefix + "." if prefix else ""
            if not dataclasses.is_dataclass(obj) or part not in {
                f.name for f in dataclasses.fields(obj)
            }:
                if not dataclasses.is_dataclass(obj):
                    raise ConfigError(f"--set {key}: {prefix.rstrip('.')} has no sub-fields")
                _unknown(prefix, part, type(obj))
            if i == len(parts) - 1:
                hint = typing.get_type_hints(type(obj))[part]
                if dataclasses.is_dataclass(hint):
                    raise ConfigError(
                        f"--set {key}: a section; set one of its fields, e.g. {key}.<field>=..."
                    )
                setattr(obj, part, _coerce(text.strip(), hint, key))
            else:
                obj = getattr(obj, part)
    return cfg.validate()


# ---------------------------------------------------------------- pipeline files


def load_pipeline(spec: str, overrides: list[str] | None = None) -> PipelineConfig:
    """Load `path/to/pipeline.py[:function]` (default function `pipeline`) and validate it."""
    path_text, _, func_name = spec.partition(":")
    func_name = func_name or "pipeline"
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(
            f"pipeline file {path} not found (give a path such as pipelines/tiny_cpu.py)"
        )
    if path.suffix != ".py":
        raise ConfigError(f"pipeline file {path} must be a Python file (.py)")
    module_name = f"opdflow_pipeline_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"pipeline file {path} cannot be imported")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ConfigError(
            f"pipeline file {path} raised {type(exc).__name__} at import: {exc} "
            "(a pipeline file must only define functions; run it with python to see the traceback)"
        ) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        funcs = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, types.FunctionType) and not n.startswith("_")
        )
        raise ConfigError(
            f"pipeline file {path} has no function {func_name!r}"
            + (f"; its functions: {', '.join(funcs)} (pick one with {path}:NAME)" if funcs else "")
        )
    try:
        cfg = func()
    except ConfigError as exc:
        raise ConfigError(f"{path}:{func_name}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"{path}:{func_name}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(cfg, PipelineConfig):
        raise ConfigError(
            f"{path}:{func_name}() returned {type(cfg).__name__}, expected opdflow.config.PipelineConfig"
        )
    try:
        return apply_overrides(cfg, list(overrides or []))
    except ConfigError as exc:
        raise ConfigError(f"{path}:{func_name}: {exc}") from exc


def pipeline_functions(path: str | Path) -> list[str]:
    """Names of the public functions of a pipeline file that return a PipelineConfig (for tests/CLI)."""
    text = Path(path).read_text()
    import ast

    tree = ast.parse(text)
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    ]
