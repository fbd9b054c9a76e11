"""The memory plan (opdflow/memory): traced per layer equals traced whole, the shipped GPU
pipelines fit their documented clusters with the plan's margin, and `opdflow validate
--gpu-mem` prints the plan and refuses what does not fit, naming the actor, the part and
the field.

The pipelines' traces are kept in the model cache ($OPDFLOW_CACHE/memory-plan), so only
the first run of this file traces them (about a minute on two cores); the per-layer test
traces every time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from opdflow.config.loader import load_pipeline
from opdflow.errors import ConfigError
from opdflow.memory import trace
from opdflow.memory.actors import plan_pipeline
from opdflow.memory.gpus import gpu_memory, node_type_gpus, placed_gpus
from opdflow.memory.plan import HEADROOM, uniform
from opdflow.memory.shape import KNOWN, ModelShape, model_shape

REPO = Path(__file__).resolve().parents[2]
DAPO = REPO / "pipelines" / "dapo_math.py"
DOCUMENTED = {  # each shipped GPU pipeline: its cluster and its GPUs' memory (GB)
    "student_7b": ("2x4:72", 96),
    "student_7b_async": ("2x4:72", 96),
    "student_7b_tp2": ("2x4:72", 96),
    "student_1p5b": ("2x4:72", 96),
    "student_7b_2x8": ("2x8:128", 80),
}

SMALL = ModelShape(
    {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
     "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
     "max_position_embeddings": 512, "tie_word_embeddings": False},
    "a small Qwen2",
)  # fmt: skip


@pytest.mark.parametrize(
    ("world", "sharded", "dtype", "ac", "gloo"),
    [(2, True, "bfloat16", True, False), (2, True, "float32", False, True),
     (1, False, "float32", False, False)],
    ids=["fsdp2-bf16-checkpointing", "fsdp2-fp32-gloo", "one-fp32-module"],
)  # fmt: skip
def test_a_learner_step_traced_per_layer_equals_the_whole_trace(world, sharded, dtype, ac, gloo):
    foreach = dtype == "bfloat16"  # the GPU-like case
    setting = trace.StepSetting(world, sharded, dtype, ac, 2, 8, 64, 3, 32, foreach, gloo)
    n = SMALL.layers
    assert n > sum(trace.BASE)  # learner_step extrapolates from BASE layers
    whole = trace.learner_step(SMALL, setting, base=(n, n))
    assert trace.learner_step(SMALL, setting) == whole  # byte for byte, every part
    assert whole["micro-batch"]["activations"] > 0 and whole["optimizer step"]["optimizer"] > 0


def test_a_prefill_traced_per_layer_equals_the_whole_trace():
    n = SMALL.layers
    for models in (1, 2):
        whole = trace.prefill(SMALL, 2, 8, 64, 32, models, base=(n, n))
        assert trace.prefill(SMALL, 2, 8, 64, 32, models) == whole
        assert whole["weights"] == models * SMALL.params() * 2  # BF16


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_shipped_gpu_pipeline_fits_its_documented_cluster(name):
    from opdflow.cluster.placement import fit, parse_cluster

    cluster, gb = DOCUMENTED[name]
    cfg = load_pipeline(f"{DAPO}:{name}")
    fit(cfg, parse_cluster(cluster))  # placed by count, then planned by memory
    plan = plan_pipeline(cfg, uniform(gb))
    stages = {a.actor.split("[")[0] for a in plan.actors}
    assert stages == {"learner", "generator", "rescorer", "teacher", "evaluator"}
    for actor in plan.actors:  # within its share of a GPU, HEADROOM kept free
        assert actor.fits and actor.peak <= actor.share * gb * 1e9 * (1 - HEADROOM), actor.lines()
    learner = plan.actors[0]
    parts = {p.name for p in learner.parts}
    assert {"parameters", "gradients", "optimizer state", "activations"} <= parts
    assert cfg.weights.transport == "auto"  # collective in two buckets, planned beside it
    assert "weight buckets" in parts
    plan.check()


def test_the_shipped_gpu_pipelines_fit_the_aws_cluster_file():
    """--cluster-yaml: each actor planned on the GPU its node type names (A100 80GB learner
    node, L40S rollout nodes)."""
    from opdflow.cluster.clusterfile import fit_cluster_file, load_cluster_file

    path = REPO / "cluster" / "aws-gpu.yaml"
    gpus = node_type_gpus(path)
    assert gpus["learner_teacher"][0] == 85.0 and gpus["rollout"][0] == 47.5
    for name in DOCUMENTED:
        cfg = load_pipeline(f"{DAPO}:{name}")
        where = fit_cluster_file(cfg, load_cluster_file(path))
        plan = plan_pipeline(cfg, placed_gpus(path, where))
        assert all(a.gpu is not None for a in plan.actors)
        plan.check()


def test_a_cluster_file_of_40_gb_gpus_is_refused_naming_the_learner(tmp_path):
    from opdflow.cli import main

    text = (REPO / "cluster" / "aws-gpu.yaml").read_text().replace("p4de.24xlarge", "p4d.24xlarge")
    path = tmp_path / "a100-40.yaml"
    path.write_text(text)
    res = CliRunner().invoke(main, ["validate", f"{DAPO}:student_7b", "--cluster-yaml", str(path)])
    assert res.exit_code == 2, res.output
    assert "A100, p4d.24xlarge" in res.output  # the GPU the file's instance type has
    assert "learner[0-1] needs " in res.output and "42 GB GPU" in res.output


def test_validate_prints_the_plan_and_refuses_a_gpu_too_small():
    from opdflow.cli import main

    args = ["validate", f"{DAPO}:student_7b", "--cluster", "2x4:72", "--gpu-mem"]
    ok = CliRunner().invoke(main, [*args, "96"])
    assert ok.exit_code == 0, ok.output
    for text in ("learner[0-1]", "optimizer state", "activations", "KV cache", "evaluator",
                 "activation checkpointing off", "its memory plan fits"):  # fmt: skip
        assert text in ok.output, text
    small = CliRunner().invoke(main, [*args, "40"])
    assert small.exit_code == 2, small.output
    assert "learner[0-1] needs" in small.output and "optimizer state" in small.output
    assert "change resources.learner.workers" in small.output


def test_a_student_whose_shape_is_unknown_is_refused_with_the_field(tmp_path):
    cfg = load_pipeline(f"{DAPO}:student_7b", [f"models.student={tmp_path}/mystery-7b"])
    with pytest.raises(ConfigError, match=r"models.student = .*mystery-7b.*config.json"):
        plan_pipeline(cfg, uniform(96))
    shape = model_shape(str(tmp_path / "x" / "DeepSeek-R1-Distill-Qwen-1.5B"), "models.student")
    assert "published config" in shape.source and shape.config == KNOWN[shape.source.split("'")[0]]
    assert 1.7e9 < shape.params() < 1.8e9


def test_a_local_config_json_is_read(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(**{k: v for k, v in SMALL.config.items() if k != "model_type"}).save_pretrained(
        tmp_path
    )
    shape = model_shape(str(tmp_path), "models.student")
    assert str(tmp_path) in shape.source and shape.layers == 8 and shape.params() == SMALL.params()


@pytest.mark.parametrize(
    ("name", "gb"),
    [("p4de.24xlarge", 85.0), ("p5.48xlarge", 85.0), ("g6e.2xlarge", 47.5),
     ("nvidia-h100-80gb", 85.0), ("NVIDIA-A100-SXM4-40GB", 42.0), ("GH200", 102.0),
     ("a3-ultragpu-8g", 150.0), ("m6i.2xlarge", None)],
)  # fmt: skip
def test_a_gpu_is_known_by_its_instance_or_accelerator_name(name, gb):
    found = gpu_memory(name)
    assert (found[0] if found else None) == gb


_PEAK_WINDOW = """
import numpy as np, torch
from opdflow.compute.device import PeakMemory, tensor_bytes
held = torch.zeros(1000, 1000)
window = PeakMemory(torch.device("cpu"), tensor_bytes([held, held, None]))
first = window.gb()
big = np.ones(200_000_000 // 8)  # 200 MB, touched
print(first, window.gb())
"""


def test_peak_memory_on_a_cpu_counts_held_tensors_and_the_rise():
    # a fresh interpreter: in a long test session, buffers the window's opening counted
    # as resident may be freed while the 200 MB are touched, and hide the rise
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_WINDOW], capture_output=True, text=True, check=True
    ).stdout
    first, then = map(float, out.split())
    assert first >= 4e6 / 1e9  # the held tensor counted once
    assert then >= 0.2 + 4e6 / 1e9 - 0.01
