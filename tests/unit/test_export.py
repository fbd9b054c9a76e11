"""opdflow export on a run directory made without Ray (a Learner writes its checkpoint as in
a run): BF16 safetensors equal to the checkpoint's FP32 weights rounded, sharded with an
index when asked, read from the checkpoint a few tensors at a time, and refusals that
name what is missing."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from opdflow.config import PipelineConfig, TrainConfig
from opdflow.errors import ConfigError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny):
    """A run directory with one committed learner checkpoint (step 3) of the tiny student
    moved off its starting weights."""
    from opdflow.record import checkpoint
    from opdflow.record.rundir import RunDir
    from opdflow.stages.learner import Learner

    run = RunDir.create(PipelineConfig(name="export"), tmp_path_factory.mktemp("e") / "run")
    learner = Learner(str(tiny.student), TrainConfig())
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    root = checkpoint.checkpoints_dir(run.path)
    staging = checkpoint.staging_dir(root, 3)
    learner.save_checkpoint(str(staging))
    checkpoint.commit(root, staging, 3, {}, keep=2)
    return run.path


def test_export_is_the_checkpoint_in_bf16_and_loads_with_transformers(run_dir, tmp_path, tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from opdflow.cli import main
    from opdflow.record.checkpoint import read_state

    res = CliRunner().invoke(main, ["export", str(run_dir), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "hf"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    fp32 = read_state(run_dir / "checkpoints" / "step_000003")
    state = model.state_dict()
    assert state.keys() == fp32.keys()
    for name, value in fp32.items():  # BF16 rounding of the learner's weights, exactly
        assert torch.equal(state[name], value.to(torch.bfloat16).float()), name
    student = AutoModelForCausalLM.from_pretrained(tiny.student, dtype=torch.float32)
    assert not torch.equal(student.state_dict()["lm_head.weight"], state["lm_head.weight"])
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok.encode("Q:123+045=")) == "Q:123+045="


def test_large_models_are_sharded_and_read_a_few_tensors_at_a_time(run_dir, tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open

    from opdflow.record.export import export_checkpoint

    reads: list[int] = []
    load = dcp.load

    def counting(state, **kw):
        reads.append(sum(t.numel() * t.element_size() for t in state.values()))
        return load(state, **kw)

    monkeypatch.setattr(dcp, "load", counting)
    from opdflow.record.export import student_paths

    student, tokenizer = student_paths(PipelineConfig())
    out = export_checkpoint(
        run_dir / "checkpoints" / "step_000003", student, tokenizer, tmp_path / "sharded",
        max_shard_bytes=400_000, read_bytes=300_000,
    )  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == shards
    largest = 0
    for name in shards:
        with safe_open(str(out / name), "pt") as f:
            size = sum(f.get_tensor(k).numel() * 2 for k in f.keys())  # noqa: SIM118
            largest = max(largest, max(f.get_tensor(k).numel() * 4 for k in f.keys()))  # noqa: SIM118
            assert size <= 400_000 or len(list(f.keys())) == 1
    assert len(reads) > len(shards) and max(reads) <= max(300_000, largest)
    assert index["metadata"]["total_size"] == sum(r // 2 for r in reads)  # FP32 read, BF16 out


def test_refusals_name_what_is_missing(run_dir, tmp_path):
    from opdflow.record.export import export_run

    with pytest.raises(ConfigError, match=r"is not a run directory: no config.json"):
        export_run(tmp_path, tmp_path / "out")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((run_dir / "config.json").read_text())
    with pytest.raises(
        ConfigError,
        match=r"has no checkpoint to export: no complete step_NNNNNN directory in .*bare/"
        r"checkpoints \(the run's checkpoint directory, which does not exist\)",
    ):
        export_run(bare, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"no checkpoint of step 7 .*there are: 3"):
        export_run(run_dir, tmp_path / "out", step=7)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match=r"--out .*full exists and is not empty"):
        export_run(run_dir, tmp_path / "full")
