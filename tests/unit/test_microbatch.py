"""Micro-batches: packing respects the token budget and covers every row once; a row's
trimmed micro-batch scores exactly as in the whole batch; the plain Learner (no Ray) takes
the same gradient micro-batch by micro-batch, with or without activation checkpointing, as
in one pass over the whole batch."""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.batches import sampled_batch

from opdflow.compute.scoring import score_batch, score_tokens
from opdflow.config import TrainConfig
from opdflow.core import microbatch
from opdflow.stages.learner import Learner


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 200)), min_size=1, max_size=40),
    budget=st.integers(0, 600),
    parts=st.integers(1, 4),
)
def test_plan_covers_every_row_once_within_the_budget(lengths, budget, parts):
    p, t = np.array(lengths).T
    groups = microbatch.plan(p, t, budget, parts)
    rows = np.sort(np.concatenate(groups))
    assert rows.tolist() == list(range(len(p)))  # each row exactly once
    assert len(groups) >= min(parts, len(p))
    for g in groups:
        padded = len(g) * (p[g].max() + t[g].max())
        assert budget == 0 or padded <= budget or len(g) == 1  # a too-long row goes alone
    if budget == 0 and parts == 1:
        assert len(groups) == 1
    dealt = microbatch.deal(groups, parts)
    assert len({len(mine) for mine in dealt}) == 1  # every rank runs as many passes
    assert sorted(int(r) for mine in dealt for g in mine if g is not None for r in g) == list(
        range(len(p))
    )


@pytest.fixture(scope="module")
def batch(tiny, tokenizer):
    b = sampled_batch(tiny, tokenizer, prompts=4, n=3, max_new_tokens=8)
    assert len(set(b.response_mask_B_T.sum(1))) > 1  # ragged: trimming matters
    return b.replace(logp_rescore_B_T=b.logp_engine_B_T, logp_teacher_B_T=b.logp_engine_B_T - 0.5)


def test_selected_rows_score_as_in_the_whole_batch(tiny, batch):
    from opdflow.inputs.models import load_model

    model = load_model(str(tiny.student), "float32")
    with torch.no_grad():
        whole = score_tokens(model, batch).logp_B_T.numpy()
        rows = np.array([5, 0, 7])
        part = batch.select(rows)
        assert part.response_ids_B_T.shape[1] == batch.response_mask_B_T[rows].sum(1).max()
        got = score_tokens(model, part).logp_B_T.numpy()
    width = got.shape[1]
    np.testing.assert_allclose(got, whole[rows, :width], atol=1e-5)
    micro = score_batch(model, batch, budget=30).logp_B_T
    np.testing.assert_allclose(micro, whole, atol=1e-5)


def _gradient(tiny, batch, train):
    learner = Learner(str(tiny.student), train, device="cpu")
    learner.opt.zero_grad(set_to_none=True)
    logp = learner.accumulate_gradients(batch).logp_B_T
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters()}
    return grads, logp, len(learner.micro_batches(batch))


@pytest.mark.parametrize("center", [False, True], ids=["opd", "centred"])
def test_micro_batched_gradient_equals_the_whole_batch_gradient(tiny, batch, center):
    whole = TrainConfig(micro_batch_tokens=0, center_advantage=center)
    ref, logp_ref, n_ref = _gradient(tiny, batch, whole)
    for variant in (
        dataclasses.replace(whole, micro_batch_tokens=30),
        dataclasses.replace(whole, micro_batch_tokens=30, activation_checkpointing=True),
    ):
        got, logp, n = _gradient(tiny, batch, variant)
        assert n_ref == 1 < n  # several micro-batches against one pass
        np.testing.assert_allclose(logp, logp_ref, atol=1e-5)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=1e-4, msg=name)
    assert max(float(g.abs().max()) for g in ref.values()) > 1e-3  # a real gradient
