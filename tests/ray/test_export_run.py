"""The demo-style run's student out as a Hugging Face checkpoint: the finished run's final/
and `opdflow export RUN_DIR` load with AutoModelForCausalLM.from_pretrained and give the
logits of the run's final learner weights (the shared 30-step k0 run; no new run)."""

from __future__ import annotations

import torch
from click.testing import CliRunner


def _logits(model, tokenizer, texts):
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits


def test_final_and_export_give_the_final_learner_weights_logits(k0_run, tmp_path, tiny):
    from transformers import AutoModelForCausalLM

    from opdflow.cli import main
    from opdflow.inputs.models import load_tokenizer
    from opdflow.record.checkpoint import checkpoints_dir, read_state

    _, metrics, run = k0_run
    final = run.path / "final"
    assert (final / "model.safetensors").is_file() and (final / "tokenizer.json").is_file()
    assert any(e["event"] == "export" for e in run.events())
    res = CliRunner().invoke(main, ["export", str(run.path), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output

    last = checkpoints_dir(run.path) / f"step_{len(metrics):06d}"  # the run's final step
    learner = read_state(last)  # the learner's FP32 weights
    tok = load_tokenizer(final)
    texts = ["Q:123+045=", "Q:999+001=168", "Q:500+250=75"]
    ref = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    ref.load_state_dict(learner)  # the learner's own FP32 weights
    exact = _logits(ref, tok, texts)
    ref.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in learner.items()})
    rounded = _logits(ref, tok, texts)
    for path in (final, tmp_path / "hf"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        logits = _logits(model, tok, texts)
        assert torch.equal(logits, rounded), path  # the learner's weights, BF16-rounded
        # and within BF16 rounding of its FP32 weights: far closer than the logits' spread
        assert (logits - exact).abs().max() < 0.05 * exact.std(), path
    student = AutoModelForCausalLM.from_pretrained(tiny.student, dtype=torch.float32)
    assert not torch.equal(_logits(student, tok, texts), rounded)  # training moved them
