"""Each stage actor is built from one frozen spec made once from the pipeline config, and
its Ray options come from one call, `Placement.options(stage)`. Pure Python: no Ray, no
model is loaded."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from opdflow.cluster.placement import Placement, grouped_actors
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.inputs.models import ResolvedModels
from opdflow.stages.specs import StageSpecs

MODELS = ResolvedModels("/m/student", "/m/teacher", "/m/tok", "/d/train", "/d/heldout")
TOKENIZER = SimpleNamespace(pad_token_id=0, eos_token_id=2)


def _cfg(*overrides: str) -> PipelineConfig:
    return apply_overrides(PipelineConfig(name="specs"), list(overrides))


def test_every_actor_spec_carries_its_fields_from_the_pipeline_config():
    cfg = _cfg(
        "resources.generator.torch_threads=3", "resources.rescorer.torch_threads=2",
        "train.logit_chunk_tokens=256", "train.micro_batch_tokens=4096", "engine.temperature=0.7",
        "eval.batch_prompts=8", "eval.save_responses=true", "data.grader=math",
    )  # fmt: skip
    specs = StageSpecs.of(cfg, MODELS, TOKENIZER)
    g, r, t, e, learner = (specs.generator, specs.rescorer, specs.teacher, specs.evaluator,
                           specs.learner)  # fmt: skip
    assert (g.model, g.pad_id, g.eos_id, g.threads, g.tokenizer, g.grader) == (
        "/m/student",
        0,
        2,
        3,
        "/m/tok",
        "math",
    )
    assert g.max_model_len == cfg.data.max_prompt_tokens + cfg.engine.max_new_tokens
    assert (r.model, r.threads, r.temperature, r.chunk_tokens, r.micro_batch_tokens) == (
        "/m/student",
        2,
        0.7,
        256,
        4096,
    )
    assert (t.model, t.chunk_tokens, t.micro_batch_tokens) == ("/m/teacher", 256, 4096)
    assert (e.student, e.teacher, e.tokenizer, e.batch_prompts, e.keep_texts, e.grader) == (
        "/m/student",
        "/m/teacher",
        "/m/tok",
        8,
        True,
        "math",
    )
    assert (learner.model, learner.train, learner.seed) == ("/m/student", cfg.train, cfg.seed)
    assert learner.with_workers(3).resources.workers == 3  # a group that healed onto 3
    assert learner.resources == cfg.resources.learner
    for spec in (g, r, t, e, learner):
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.model = "elsewhere"  # type: ignore[misc]


def test_placement_options_give_an_actors_ray_options_in_one_call():
    cfg = _cfg(
        "resources.rescorer.num_cpus=2", 'resources.rescorer.resources={"rollout": 1}',
        "reliability.max_restarts=4",
    )  # fmt: skip
    placement = Placement(cfg.resources, grouped_actors(cfg), cfg.reliability.max_restarts)
    rescorer = placement.options("rescorer")  # no placement groups reserved: anywhere
    assert rescorer == {
        "num_cpus": 2.0, "num_gpus": cfg.resources.rescorer.num_gpus, "max_restarts": 4,
        "max_task_retries": -1, "resources": {"rollout": 1},
    }  # fmt: skip
    learner = placement.options("learner")  # it heals instead of restarting
    assert learner["max_restarts"] == 0 and learner["max_task_retries"] == 0
    assert placement.options("teacher", where="a strategy")["scheduling_strategy"] == "a strategy"
