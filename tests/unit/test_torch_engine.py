"""TorchEngine on the real tiny student (no Ray)."""

import numpy as np
import pytest
import torch

from opdflow.compute.scoring import token_logprobs
from opdflow.core.mismatch import engine_mismatch, exact_kl_per_token
from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.engines.torch_engine import TorchEngine, sampling_logdist
from opdflow.errors import ConfigError
from opdflow.inputs.data import load_prompts
from opdflow.inputs.models import load_model, native_bf16


@pytest.fixture(scope="module")
def engine(tiny, tokenizer):
    return TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def prompts(tiny, tokenizer):
    return load_prompts(tiny.heldout, tokenizer, limit=16)


def _request(prompts, params, seed=0, n=4):
    return GenerationRequest(
        prompts.token_ids, list(range(len(prompts))), prompts.answers, n, seed, 0, params
    )


def test_logprobs_are_those_of_the_distribution_sampled_from(engine, prompts):
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=6, return_logdist=True)
    batch = engine.generate(_request(prompts, params))
    lp = np.take_along_axis(batch.logdist_engine_B_T_V, batch.response_ids_B_T[..., None], -1)[
        ..., 0
    ]
    m = batch.response_mask_B_T
    assert np.allclose(lp[m], batch.logp_engine_B_T[m], atol=1e-6)
    # top-p: every sampled token lies inside the nucleus (finite log-probability)
    assert np.isfinite(batch.logp_engine_B_T[m]).all()
    assert np.isinf(batch.logdist_engine_B_T_V[m]).any()


def test_top_p_and_temperature_transform():
    logits = torch.tensor([[2.0, 1.0, 0.0, -5.0]])
    full = sampling_logdist(logits, SamplingParams(temperature=2.0))
    assert torch.allclose(full, torch.log_softmax(logits / 2.0, -1))
    nucleus = sampling_logdist(logits, SamplingParams(top_p=0.7))
    p = torch.softmax(logits, -1)[0]
    assert p[0] < 0.7 < p[0] + p[1]  # so the nucleus is the first two tokens
    assert torch.isinf(nucleus[0, 2:]).all()
    assert torch.allclose(nucleus[0, :2].exp().sum(), torch.tensor(1.0))


def test_responses_stop_at_eos_and_are_reproducible(engine, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=8)
    a = engine.generate(_request(prompts, params, seed=5))
    b = engine.generate(_request(prompts, params, seed=5))
    assert np.array_equal(a.response_ids_B_T, b.response_ids_B_T)
    eos = tokenizer.eos_token_id
    for ids, mask in zip(a.response_ids_B_T, a.response_mask_B_T):
        valid = ids[mask]
        if eos in valid:
            assert valid[-1] == eos and list(valid).count(eos) == 1
        assert mask[: mask.sum()].all()  # the mask is a prefix
    assert a.num_responses == 16 * 4
    assert list(a.prompt_index_B[:5]) == [0, 0, 0, 0, 1]


def test_bf16_engine_matches_a_bf16_prefill_rescore_closely(engine, prompts, tiny):
    params = SamplingParams(max_new_tokens=8, return_logdist=True)
    batch = engine.generate(_request(prompts, params))
    student = load_model(str(tiny.student), "bfloat16")
    with torch.no_grad():
        lp, logdist = token_logprobs(student, batch, want_logdist=True)
    kl = exact_kl_per_token(batch.logdist_engine_B_T_V, logdist.numpy())
    d = engine_mismatch(batch.replace(logp_rescore_B_T=lp.numpy(), kl_engine_exact_B_T=kl))
    assert d.tokens > 100
    assert abs(d.k1) < 5e-3
    assert 0 <= d.exact < 1e-3


def test_loading_other_weights_changes_the_samples(tiny, tokenizer, prompts):
    eng = TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id)
    params = SamplingParams(max_new_tokens=6, return_logdist=True)
    before = eng.generate(_request(prompts, params, n=1))
    teacher = load_model(str(tiny.teacher), "bfloat16")
    eng.load_weights(teacher.state_dict(), version=3)
    after = eng.generate(_request(prompts, params, n=1))
    assert eng.version == 3 and after.version == 3
    assert not np.allclose(before.logdist_engine_B_T_V[:, 0], after.logdist_engine_B_T_V[:, 0])


def test_bf16_stages_hold_bf16_weights_and_compute_where_it_is_fast(tiny, monkeypatch):
    monkeypatch.delenv("OPDFLOW_BF16_COMPUTE", raising=False)
    auto = next(load_model(str(tiny.student)).parameters()).dtype
    assert auto == (torch.bfloat16 if native_bf16() else torch.float32)
    for choice in ("float32", "bfloat16"):
        monkeypatch.setenv("OPDFLOW_BF16_COMPUTE", choice)
        for p in load_model(str(tiny.student)).parameters():
            assert p.dtype == getattr(torch, choice)
            assert torch.equal(p, p.to(torch.bfloat16).to(p.dtype))  # bf16 values either way
    monkeypatch.setenv("OPDFLOW_BF16_COMPUTE", "fp16")
    with pytest.raises(ConfigError, match="OPDFLOW_BF16_COMPUTE"):
        load_model(str(tiny.student))
