"""The paper's setups on GPUs: 1.5B and 7B students on DAPO-Math-17k with vLLM rollouts.

    opdflow validate pipelines/dapo_math.py:student_7b --cluster 2x4:72
    opdflow validate pipelines/dapo_math.py:student_7b --cluster-yaml cluster/aws-gpu.yaml
    OPDFLOW_MODELS=/ckpt OPDFLOW_DATA=/data opdflow submit pipelines/dapo_math.py:student_7b ...

As the paper states them: students DeepSeek-R1-Distill-Qwen-7B and -1.5B, each taught by
an RL-fine-tuned version of itself; 200 steps of 8 problems x 8 responses at temperature
1, up to 16,384 tokens per response, learning rate 1e-6; the standard run is synchronous
BF16 (k = 0); held-out KL on 530 problems (AIME24 + MATH-500); two nodes of four GPUs (the
paper's GH200s, 96 GB each).

Memory is planned for those GPUs (96 GB; `opdflow validate PIPELINE --cluster 2x4:72
--gpu-mem 96` prints each GPU actor's peak by part and refuses what does not fit, see
docs/MEMORY.md). The learner is 2 FSDP2 ranks (bf16 compute, FP32 master weights and
AdamW: 61 GB of sharded state per rank for 7B, 14 GB for 1.5B) with activation
checkpointing per decoder layer; a learner micro-batch holds one full-length response for
7B (2,048 + 16,384 tokens; rank 0 peaks at 78 GB of 96) and two for 1.5B (28 GB); the
rescorer, teacher and evaluator's prefill use the same budget; the evaluator generates 32
(7B) or 64 (1.5B) held-out prompts at a time with a BF16 vLLM engine (40% of its GPU; the
BF16 student and the teacher that score the responses hold the rest: 73 GB for 7B). On
GPUs given as `--gpu-mem 80` the 2-rank 7B learner does not fit (78 GB is over 95% of
80; an A100 80GB reports 85 GB, where it does: 92%); `student_7b_2x8` has 4 ranks (59 GB
at rank 0's peak). Weights move by
`weights.transport = "auto"`: between GPUs the collective, a version staged in host memory
and sent in two buckets of `weights.bucket_mb` (256 MiB) on each side.
Answers are graded by math-verify
(data.grader = "math": `\\boxed{}` answers against DAPO's ground truth and the held-out
set's answers, 1/2 = 0.5 = \\frac{1}{2}), for held-out accuracy and RL baselines.

Nothing is downloaded. Checkpoints are local Hugging Face directories under
$OPDFLOW_MODELS (default ./models), prompts local parquet files under $OPDFLOW_DATA
(default ./data); any path can be set instead with --set models.student=... /
data.train=.... The paper's teachers are not published: put yours at the teacher path.
`opdflow validate` checks the config only (as for every pipeline); the paths are checked
when `opdflow run` starts, each error naming the field. The numbers the paper does not
give are marked "assumed".
"""

import dataclasses
import os

from opdflow.config import (
    DataConfig,
    EngineConfig,
    EvalConfig,
    LearnerResources,
    ModelsConfig,
    PipelineConfig,
    PlacementConfig,
    ReliabilityConfig,
    ResourcesConfig,
    StageResources,
    StalenessConfig,
    TrainConfig,
)


def _dirs() -> tuple[str, str]:
    return os.environ.get("OPDFLOW_MODELS", "models"), os.environ.get("OPDFLOW_DATA", "data")


def _paper(
    name: str,
    student: str,
    resources: ResourcesConfig,
    micro_batch_tokens: int,
    eval_batch: int,
) -> PipelineConfig:
    models, data = _dirs()
    return PipelineConfig(
        name=name,
        models=ModelsConfig(student=f"{models}/{student}", teacher=f"{models}/{student}-RL"),
        data=DataConfig(
            train=f"{data}/dapo-math-17k.parquet",  # DAPO's schema: chat-message prompts
            heldout=f"{data}/aime24-math500.parquet",  # 530 rows, a `prompt` column
            prompts_per_step=8,
            responses_per_prompt=8,
            max_prompt_tokens=2048,  # assumed: DAPO prompts are a few hundred tokens
            grader="math",  # \boxed{} answers in equivalent forms
        ),
        engine=EngineConfig(kind="vllm", recipe="bf16", replicas=4, max_new_tokens=16384),
        train=TrainConfig(
            steps=200,
            lr=1e-6,
            micro_batch_tokens=micro_batch_tokens,
            activation_checkpointing=True,
        ),
        staleness=StalenessConfig(policy="fixed", k=0),
        # every, samples: assumed
        eval=EvalConfig(every=50, prompts=530, samples_per_prompt=1, batch_prompts=eval_batch),
        resources=resources,
        reliability=ReliabilityConfig(
            checkpoint_every=20,
            stage_timeout_s=3600.0,  # one 16k-token batch takes minutes
            startup_timeout_s=1800.0,  # 7B checkpoints load and vLLM starts
        ),
    )


def _resources() -> ResourcesConfig:
    """The paper setups' actors. One node (STRICT_PACK): the learner's 2 ranks on a GPU
    each, the rescorer and the teacher sharing a GPU, the evaluator on one; the other node
    (STRICT_PACK): 4 vLLM replicas, a GPU each."""
    scorer = StageResources(num_cpus=4, num_gpus=0.5, torch_threads=4)
    return ResourcesConfig(
        generator=StageResources(num_cpus=8, num_gpus=1),
        learner=LearnerResources(num_cpus=16, num_gpus=1, torch_threads=16, workers=2),
        rescorer=scorer,
        teacher=dataclasses.replace(scorer),
        evaluator=StageResources(num_cpus=8, num_gpus=1, torch_threads=8),
        placement=PlacementConfig(
            groups=[["learner", "rescorer", "teacher", "evaluator"], ["generator"]],
            strategy="STRICT_PACK",
        ),
    )


def student_7b() -> PipelineConfig:
    """7B student, synchronous BF16 (the standard run), on two nodes of four 96 GB GPUs.
    Weights by the default transport ("auto": the collective between GPUs): each version
    is staged in host memory and sent in two 256 MiB buckets, which the learner's GPU has
    room for beside its 61 GB of sharded state (rank 0 peaks at 78 GB of 96)."""
    return _paper(
        "dapo-7b",
        "DeepSeek-R1-Distill-Qwen-7B",
        _resources(),
        micro_batch_tokens=18432,  # one 2,048 + 16,384-token response
        eval_batch=32,
    )


def student_7b_async() -> PipelineConfig:
    """The 7B run with weights up to 4 versions stale (the paper: 1.62x the standard's
    throughput, held-out KL within 3%)."""
    cfg = student_7b()
    cfg.name = "dapo-7b-k4"
    cfg.staleness.k = 4
    return cfg


def student_7b_2x8() -> PipelineConfig:
    """The 7B standard run on two nodes of eight GPUs of 80 GB or more: 4 learner ranks
    (30 GB of sharded state each, room for two responses per micro-batch: 59 GB at rank
    0's peak) beside the rescorer + teacher GPU and the evaluator's on one node; 10 vLLM
    replicas on the GPUs left (2 + 8).

        opdflow validate pipelines/dapo_math.py:student_7b_2x8 --cluster 2x8:128
    """
    cfg = student_7b()
    cfg.name = "dapo-7b-2x8"
    cfg.resources.learner.workers = 4
    cfg.resources.placement.groups = [["learner", "rescorer", "teacher", "evaluator"]]
    cfg.engine.replicas = 10
    cfg.train.micro_batch_tokens = 36864
    return cfg


def student_7b_tp2() -> PipelineConfig:
    """The 7B standard run with tensor-parallel vLLM replicas: 2 replicas of 2 GPUs each (one
    placement bundle of 2 GPUs per replica) on the rollout node, for responses whose KV
    cache outgrows one GPU.

        opdflow validate pipelines/dapo_math.py:student_7b_tp2 --cluster 2x4:72
    """
    cfg = student_7b()
    cfg.name = "dapo-7b-tp2"
    cfg.engine.tensor_parallel_size = 2
    cfg.engine.replicas = 2
    cfg.resources.generator.num_gpus = 2
    return cfg


def student_1p5b() -> PipelineConfig:
    """1.5B student, synchronous BF16: the same layout, twice the learner's micro-batch."""
    return _paper(
        "dapo-1p5b",
        "DeepSeek-R1-Distill-Qwen-1.5B",
        _resources(),
        micro_batch_tokens=36864,  # two full-length responses
        eval_batch=64,
    )


def pipeline() -> PipelineConfig:
    """The default: the 7B standard run."""
    return student_7b()
