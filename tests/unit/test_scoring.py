"""Chunked scoring equals the unchunked reference: logp, entropy, exact KL and gradients."""

import numpy as np
import pytest
import torch

from opdflow.compute.scoring import _ChunkedLogprob, exact_kl_between, score_tokens, token_logprobs
from opdflow.core.mismatch import exact_kl_per_token
from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.engines.torch_engine import TorchEngine
from opdflow.inputs.data import load_prompts
from opdflow.inputs.models import load_model

CHUNK = 5  # far fewer than the batch's response tokens, and not a divisor of them


@pytest.fixture(scope="module")
def batch(tiny, tokenizer):
    """Hot top-p samples with the engine's log-distributions (some -inf entries)."""
    engine = TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id)
    prompts = load_prompts(tiny.heldout, tokenizer, limit=6)
    params = SamplingParams(temperature=1.5, top_p=0.9, max_new_tokens=8, return_logdist=True)
    req = GenerationRequest(prompts.token_ids, list(range(6)), prompts.answers, 3, 7, 0, params)
    b = engine.generate(req)
    assert b.response_mask_B_T.sum() > 4 * CHUNK and not b.response_mask_B_T.all()
    return b


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_logp_entropy_and_kl_match_the_full_distribution(tiny, batch, dtype, temperature):
    model = load_model(str(tiny.student), dtype)
    mask = batch.response_mask_B_T
    with torch.no_grad():
        ref_logp, logdist = token_logprobs(model, batch, temperature, want_logdist=True)
        got = score_tokens(
            model,
            batch,
            temperature,
            entropy=True,
            ref_logdist_B_T_V=batch.logdist_engine_B_T_V,
            chunk_tokens=CHUNK,
        )
    tol = 1e-6 if dtype == "float32" else 1e-5
    assert torch.allclose(got.logp_B_T, ref_logp, atol=tol), (got.logp_B_T - ref_logp).abs().max()
    ref_ent = torch.where(torch.tensor(mask), -(logdist.exp() * logdist).sum(-1), 0.0)
    assert torch.allclose(got.entropy_B_T, ref_ent, atol=tol)
    assert float(got.entropy_B_T[torch.tensor(mask)].min()) > 0.01
    ref_kl = exact_kl_per_token(batch.logdist_engine_B_T_V, logdist.numpy()) * mask
    assert np.allclose(got.kl_B_T.numpy(), ref_kl, rtol=1e-5, atol=1e-7)
    assert ref_kl.max() > 0.01  # hot sampling vs the temperature-1 model: a visible KL
    assert (got.logp_B_T.numpy()[~mask] == 0).all() and (got.kl_B_T.numpy()[~mask] == 0).all()


def test_chunked_gradient_equals_the_unchunked_gradient(tiny, batch):
    torch.manual_seed(0)
    weights_B_T = torch.randn(batch.response_ids_B_T.shape)

    def grads(chunk: int | None) -> dict[str, torch.Tensor]:
        model = load_model(str(tiny.student), "float32").train()
        if chunk is None:
            logp, _ = token_logprobs(model, batch, 1.5, want_logdist=True)
        else:
            logp = score_tokens(model, batch, 1.5, chunk_tokens=chunk).logp_B_T
        (logp * weights_B_T).sum().backward()
        return {k: p.grad for k, p in model.named_parameters()}

    full, chunked = grads(None), grads(CHUNK)
    assert full.keys() == chunked.keys() and "lm_head.weight" in full
    for name, g in full.items():
        scale = float(g.abs().max())
        assert scale > 0, name
        assert torch.allclose(chunked[name], g, atol=1e-5 * scale, rtol=1e-4), name


def test_autograd_function_with_bias_passes_gradcheck():
    torch.manual_seed(0)
    h = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))

    def logp(h, w, b):
        return _ChunkedLogprob.apply(h, w, b, targets, 0.7, 3, False, None, None)[0]

    assert torch.autograd.gradcheck(logp, (h, w, b))
    full = torch.log_softmax((h @ w.T + b) / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(logp(h, w, b), full)


def test_exact_kl_between_two_models_matches_their_full_distributions(tiny, batch):
    student = load_model(str(tiny.student), "bfloat16")
    teacher = load_model(str(tiny.teacher), "bfloat16")
    with torch.no_grad():
        _, logq = token_logprobs(student, batch, want_logdist=True)
        _, logp = token_logprobs(teacher, batch, want_logdist=True)
    ref = exact_kl_per_token(logq.numpy(), logp.numpy()) * batch.response_mask_B_T
    got = exact_kl_between(student, teacher, batch, chunk_tokens=CHUNK).numpy()
    # the reference renormalises float32 log-softmax in float64, the chunked path sums it
    # as is: they agree to float32 precision (measured max relative gap 1e-4 at KL ~ 1e-3)
    assert np.allclose(got, ref, rtol=1e-3, atol=1e-6)
    assert ref.sum() > 0.1


def test_chunk_tokens_must_be_positive(tiny, batch):
    model = load_model(str(tiny.student), "bfloat16")
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        score_tokens(model, batch, chunk_tokens=0)
