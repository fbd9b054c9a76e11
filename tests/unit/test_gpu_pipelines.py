"""The paper's GPU pipelines (pipelines/dapo_math.py): they validate, follow the paper (docs/DESIGN.md), and
fit two nodes of four GPUs; a pipeline that asks for more, or for GPU shares that do not
tile a GPU, is refused with the field named."""

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from opdflow.cluster.placement import fit, parse_cluster
from opdflow.config.loader import load_pipeline, pipeline_functions
from opdflow.errors import ConfigError

FILE = Path(__file__).resolve().parents[2] / "pipelines" / "dapo_math.py"
SPECS = [f"{FILE}:{name}" for name in pipeline_functions(FILE)]
PAPER_CLUSTER = "2x4:72"  # two nodes of four GH200 (72 cores each)
CLUSTERS = {"student_7b_2x8": ("2x8:128", "2x4:72")}  # function: (its cluster, too small)


PROTOCOL = (
    "engine.kind", "engine.recipe", "engine.max_new_tokens", "engine.temperature",
    "data.train", "data.heldout", "data.grader", "data.prompts_per_step",
    "data.responses_per_prompt", "data.max_prompt_tokens", "train.lr", "train.steps",
    "eval.prompts", "eval.every", "eval.samples_per_prompt",
)  # fmt: skip
"""What the paper holds fixed across its runs (the runs are compared on it)."""


def _flat(cfg) -> dict:
    """A pipeline config as {"section.field": value}."""
    out = {}
    for section, fields in dataclasses.asdict(cfg).items():
        if isinstance(fields, dict):
            out.update({f"{section}.{k}": v for k, v in fields.items()})
        else:
            out[section] = fields
    return out


def test_the_file_has_both_students():
    assert {"student_7b", "student_1p5b", "student_7b_async"} <= set(pipeline_functions(FILE))


def test_the_standard_run_and_its_async_variant_differ_only_in_k():
    """The paper's comparison: the standard run (synchronous BF16, k = 0) against the same
    run with weights up to k versions stale; the held-out set is AIME24 (30 problems) and
    MATH-500 (500), one evaluation prompt per problem."""
    standard = load_pipeline(f"{FILE}:student_7b")
    stale = load_pipeline(f"{FILE}:student_7b_async")
    a, b = _flat(standard), _flat(stale)
    assert {key for key in a if a[key] != b[key]} == {"name", "staleness.k"}
    assert standard.staleness.k == 0 < stale.staleness.k
    assert standard.engine.recipe == "bf16" and standard.engine.kind == "vllm"
    assert standard.eval.prompts == 30 + 500
    # the 1.5B student: the same protocol and layout, a smaller model, larger micro-batches
    small = load_pipeline(f"{FILE}:student_1p5b")
    assert small.resources == standard.resources and small.staleness == standard.staleness
    assert small.train.micro_batch_tokens > standard.train.micro_batch_tokens


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.split(":")[-1])
def test_each_follows_the_paper_and_fits_its_cluster(spec):
    cfg = load_pipeline(spec)
    # the paper's protocol, one for every variant: a variant changes size, placement or k,
    # never what the runs are compared on
    standard = _flat(load_pipeline(f"{FILE}:student_7b"))
    assert {key: _flat(cfg)[key] for key in PROTOCOL} == {key: standard[key] for key in PROTOCOL}
    # each student is taught by an RL-fine-tuned version of itself
    assert cfg.models.teacher == cfg.models.student + "-RL"
    # memory by token budgets: a micro-batch holds a full-length response, layers recompute
    row = cfg.data.max_prompt_tokens + cfg.engine.max_new_tokens
    assert row <= cfg.train.micro_batch_tokens <= 2 * row
    assert cfg.train.activation_checkpointing and cfg.eval.batch_prompts < cfg.eval.prompts
    assert cfg.resources.learner.workers >= 2  # sharded: no GPU holds the whole FP32 state
    # weights by the collective in two buckets, which the memory plan fits beside the
    # learner's state (tests/unit/test_memory_plan.py)
    assert cfg.weights.transport == "auto"
    cluster, too_small = CLUSTERS.get(spec.split(":")[-1], (PAPER_CLUSTER, "1x4:72"))
    where = fit(cfg, parse_cluster(cluster))
    workers = cfg.resources.learner.workers
    assert len(where) == 3 + workers + cfg.engine.replicas  # every actor placed
    assert {f"learner[{i}]" for i in range(workers)} <= where.keys()
    assert len({where[s] for s in ("learner[0]", "rescorer", "teacher", "evaluator")}) == 1
    gpus = sum(
        getattr(cfg.resources, a.split("[")[0]).num_gpus for a in where
    )  # every GPU used, none oversubscribed
    nodes = parse_cluster(cluster)
    assert gpus == sum(n["GPU"] for n in nodes)
    with pytest.raises(ConfigError, match=r"no node has it left|needs|more than any node has"):
        fit(cfg, parse_cluster(too_small))
    with pytest.raises(ConfigError, match="CPU"):
        fit(cfg, parse_cluster(cluster.split(":")[0] + ":16"))  # too few CPUs per node


def test_paths_come_from_the_environment_and_validate_does_not_need_them(monkeypatch):
    monkeypatch.setenv("OPDFLOW_MODELS", "/nowhere/models")
    monkeypatch.setenv("OPDFLOW_DATA", "/nowhere/data")
    cfg = load_pipeline(f"{FILE}:student_1p5b", ["staleness.k=4"])
    assert cfg.models.student == "/nowhere/models/DeepSeek-R1-Distill-Qwen-1.5B"
    assert cfg.models.teacher == "/nowhere/models/DeepSeek-R1-Distill-Qwen-1.5B-RL"
    assert cfg.data.heldout == "/nowhere/data/aime24-math500.parquet"
    assert cfg.staleness.k == 4

    from opdflow.cli import main

    res = CliRunner().invoke(main, ["validate", f"{FILE}:student_7b", "--cluster", PAPER_CLUSTER])
    assert res.exit_code == 0, res.output
    assert "fits 2x4:72" in res.output and "node 1: generator[0]" in res.output


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["resources.teacher.num_gpus=0.3"], r"resources.teacher.num_gpus = 0.3 does not divide"),
        (["resources.learner.num_gpus=1.5"], r"resources.learner.num_gpus = 1.5: above 1"),
        (["resources.generator.num_gpus=2"], r"engine.kind='vllm'.*takes 1 GPU"),
        (
            ["resources.learner.num_gpus=2"],
            r"learner\+rescorer\+teacher\+evaluator \(STRICT_PACK\)",
        ),
        (["engine.replicas=5"], r"generator\[4\] of generator \(STRICT_PACK\)|generator \(STRICT"),
        (["engine.max_replicas=6", "resources.placement.groups=[]"], r"generator\[\d\]|evaluator"),
    ],
)
def test_asking_for_more_than_the_cluster_or_uneven_gpu_shares_is_refused(overrides, match):
    cfg = load_pipeline(f"{FILE}:student_7b", overrides)
    with pytest.raises(ConfigError, match=match):
        fit(cfg, parse_cluster(PAPER_CLUSTER))


def test_a_tensor_parallel_variant_places_each_replica_on_gpus_of_one_node():
    """engine.tensor_parallel_size = 2: each replica is one bundle of 2 GPUs on one node
    (`opdflow validate ... --cluster 2x4:72`); 4 such replicas in one STRICT_PACK group
    cannot fit a 4-GPU node and are refused with what they ask and the largest node."""
    from opdflow.cli import main

    cfg = load_pipeline(f"{FILE}:student_7b_tp2")
    assert (cfg.engine.tensor_parallel_size, cfg.resources.generator.num_gpus) == (2, 2)
    where = fit(cfg, parse_cluster(PAPER_CLUSTER))
    assert where["generator[0]"] == where["generator[1]"] != where["learner[0]"]
    res = CliRunner().invoke(main, ["validate", f"{FILE}:student_7b_tp2", "--cluster", "2x4:72"])
    assert res.exit_code == 0 and "node 1: generator[0], generator[1]" in res.output, res.output
    four = ["engine.tensor_parallel_size=2", "resources.generator.num_gpus=2"]
    args = ["validate", f"{FILE}:student_7b", "--cluster", "2x4:72"]
    res = CliRunner().invoke(main, args + [x for kv in four for x in ("--set", kv)])
    assert res.exit_code == 2
    assert (
        "generator (STRICT_PACK) asks 32 CPU, 8 GPU on one node, more than any node has: "
        "the largest node, node 0, has 72 CPU, 4 GPU" in res.output
    ), res.output
    # a replica's GPUs are its tensor-parallel ranks, no more, no fewer
    with pytest.raises(
        ConfigError, match=r"so it takes 2 GPUs \(set resources.generator.num_gpus=2"
    ):
        fit(load_pipeline(f"{FILE}:student_7b", four[:1]), parse_cluster(PAPER_CLUSTER))
    with pytest.raises(
        ConfigError, match=r"engine.tensor_parallel_size = 2 .*engine.kind = 'vllm'"
    ):
        load_pipeline(f"{FILE}:student_7b", ["engine.kind=torch", *four])


def test_fractional_shares_that_tile_a_gpu_pack_onto_it():
    cfg = load_pipeline(f"{FILE}:student_1p5b")
    assert cfg.resources.rescorer.num_gpus == cfg.resources.teacher.num_gpus == 0.5
    where = fit(cfg, parse_cluster(PAPER_CLUSTER))
    assert where["rescorer"] == where["teacher"] == where["learner[0]"]


@pytest.mark.parametrize("spec", ["4", "2x", "0x4", "2x4:0", "axb"])
def test_a_bad_cluster_spec_says_the_format(spec):
    with pytest.raises(ConfigError, match="NODESxGPUS"):
        parse_cluster(spec)
