"""The learner's FP32 -> BF16 cast beside its next step publishes, byte for byte, a plain
cast of the weights it was started on (in its thread, in the caller, or on a side stream:
the GPU path's branches, through a stand-in device layer): the step settles it before its
optimizer writes them, and a failed cast is raised where the bytes would be used."""

from __future__ import annotations

import pytest
import torch
from support.batches import sampled_batch
from support.weight_memory import RecordingMemory

from opdflow.weights.cast import BF16Cast, bf16_entries
from opdflow.weights.version import allocate, views


def _plain_bits(state):
    """A plain cast of each floating tensor to BF16 (others kept), as 16-bit patterns."""
    return {
        k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).view(torch.int16)
        for k, v in state.items()
    }


def _published_bits(packed):
    return {k: v.view(torch.int16) for k, v in views(packed).items()}


def _assert_same_bytes(packed, expected):
    got = _published_bits(packed)
    assert got.keys() == expected.keys()
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


@pytest.mark.parametrize("mode", ["thread", "caller", "stream"])
def test_the_published_bytes_are_a_plain_cast_of_the_weights_it_started_on(mode):
    torch.manual_seed(0)
    state = {"a": torch.randn(1000, 37), "b": torch.randn(5) * 1e30, "n": torch.arange(3)}
    cast = BF16Cast(mode == "thread", RecordingMemory(cuda=mode == "stream"))
    assert cast.mode == mode
    packed = allocate(bf16_entries(state), 1)
    expected = _plain_bits({k: v.clone() for k, v in state.items()})
    done = cast.start(state, packed)
    assert cast.settle() >= 0
    assert done.done() or mode == "stream"  # a stream orders the update on the device
    with torch.no_grad():  # the update a settled step makes: the version keeps its bytes
        state["a"].mul_(3.0)
    _assert_same_bytes(packed, expected)
    assert done.result() is packed and cast.last_cast_s >= 0
    cast.close()


def test_a_learner_step_waits_for_the_cast_and_the_version_keeps_its_bytes(tiny, tokenizer):
    from opdflow.config import TrainConfig
    from opdflow.stages.learner import Learner

    batch = sampled_batch(tiny, tokenizer, prompts=2, n=2, max_new_tokens=6)
    batch = batch.replace(
        logp_rescore_B_T=batch.logp_engine_B_T, logp_teacher_B_T=batch.logp_engine_B_T - 1.0
    )
    learner = Learner(str(tiny.student), TrainConfig(lr=1e-2), device="cpu")
    assert learner.cast.mode == "thread"  # one unsharded CPU worker casts beside its next step
    before = _plain_bits(learner.model.state_dict())
    packed = allocate(learner.bf16_entries(), learner.version)
    done = learner.cast_bf16(packed)
    out = learner.train_step(0, batch)
    assert done.done() and out["cast_wait_s"] >= 0  # settled before the optimizer step
    _assert_same_bytes(packed, before)
    after = _plain_bits(learner.model.state_dict())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step moved them
    _assert_same_bytes(learner.bf16_weights(), after)


def test_a_failed_cast_is_raised_where_its_bytes_would_be_used():
    state = {"a": torch.randn(4, 4)}
    wrong = allocate(bf16_entries({"a": torch.zeros(2, 2)}), 1)  # a buffer of another shape
    cast = BF16Cast(background=True)
    done = cast.start(state, wrong)
    with pytest.raises(RuntimeError):
        cast.settle()
    with pytest.raises(RuntimeError):
        done.result()
    assert cast.settle() == 0.0  # raised once; the next cast starts clean
    cast.close()
