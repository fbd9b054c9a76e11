"""VLLMEngine on vLLM's CPU build: the same contract as TorchEngine, measured against it.

Each engine is rescored by the BF16 transformers student (the Rescorer's code path) on
the tokens it produced: logprobs agree up to numerics, fp8 KV shows more mismatch, a
weights update through the object store moves the engine onto the new weights.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.mismatch import exact_kl, k1


def _request(prompts, params=None, seed=7, n=4, version=0):
    return GenerationRequest(
        prompts,
        list(range(len(prompts))),
        [None] * len(prompts),
        n,
        seed=seed,
        version=version,
        params=params or SamplingParams(return_logdist=True),
    )


def _rescore(model_path, batch, params):
    """logp_B_T and logdist_B_T_V of the distribution sampled from, under transformers BF16."""
    from opdflow.engines.torch_engine import sampling_logdist
    from opdflow.models import load_model
    from opdflow.scoring import batch_tensors

    model = load_model(str(model_path), "bfloat16")
    ids, attn, pos, P = batch_tensors(batch)
    T = batch.response_ids_B_T.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    B, _, V = logits.shape
    flat = logits[:, P - 1 : P - 1 + T].reshape(B * T, V)
    logdist = sampling_logdist(flat, params).reshape(B, T, V)
    logp = logdist.gather(-1, ids[:, P : P + T, None]).squeeze(-1)
    logp = torch.where(torch.from_numpy(batch.response_mask_B_T), logp, 0.0)
    return logp.numpy(), logdist.numpy()


@pytest.fixture(scope="module")
def engine(make_engine):
    eng = make_engine("bf16")
    yield eng
    del eng
    gc.collect()


def test_sampled_logprobs_agree_with_a_transformers_rescore(engine, prompts, tiny):
    params = SamplingParams(return_logdist=True)
    batch = engine.generate(_request(prompts, params))
    mask = batch.response_mask_B_T
    assert batch.num_responses == 4 * len(prompts) and batch.num_tokens > 100
    assert batch.version == 0 and batch.recipe == "bf16"
    # every response ends in EOS within the cap or runs to the cap; nothing after EOS
    assert ((batch.response_ids_B_T == 1) & mask).sum(1).max() <= 1
    logp, logdist = _rescore(tiny.student, batch, params)
    diff = np.abs(batch.logp_engine_B_T - logp)[mask]
    d_engine = k1(batch.logp_engine_B_T, logp, mask)
    kl = exact_kl(batch.logdist_engine_B_T_V, logdist, mask)
    print(
        f"vllm bf16 vs transformers bf16: |dlogp| mean {diff.mean():.2e} max {diff.max():.2e}, "
        f"k1 {d_engine:.2e}, exact KL {kl:.2e} over {int(mask.sum())} tokens"
    )
    assert diff.mean() < 2e-2 and diff.max() < 1.0, (diff.mean(), diff.max())
    assert abs(d_engine) < 5e-3 and 0 <= kl < 1e-3, (d_engine, kl)
    # full distributions are distributions
    probs = np.exp(batch.logdist_engine_B_T_V[mask]).sum(-1)
    np.testing.assert_allclose(probs, 1.0, atol=1e-3)


def test_logprobs_are_those_of_the_tempered_distribution(engine, prompts, tiny):
    params = SamplingParams(temperature=0.7, return_logdist=False)
    batch = engine.generate(_request(prompts, params, seed=11))
    assert batch.logdist_engine_B_T_V is None
    logp, _ = _rescore(tiny.student, batch, params)
    mask = batch.response_mask_B_T
    diff = np.abs(batch.logp_engine_B_T - logp)[mask]
    assert diff.mean() < 2e-2, diff.mean()
    # and they are not the untempered ones: the check can tell the two apart
    raw, _ = _rescore(tiny.student, batch, SamplingParams())
    assert np.abs(batch.logp_engine_B_T - raw)[mask].mean() > 3 * diff.mean()


def test_top_p_logprobs_are_renormalised_over_the_nucleus(engine, prompts, tiny):
    # Which boundary token the nucleus keeps depends on numerics, so compare with the
    # tempered distribution: renormalising over the nucleus can only raise a logprob.
    params = SamplingParams(temperature=0.7, top_p=0.8, return_logdist=True)
    batch = engine.generate(_request(prompts, params, seed=12))
    mask = batch.response_mask_B_T
    tempered, _ = _rescore(tiny.student, batch, SamplingParams(temperature=0.7))
    gain = (batch.logp_engine_B_T - tempered)[mask]
    # bf16 numerics move single tokens by up to ~0.4 nats (see the first test), not many
    assert (gain > -5e-2).mean() > 0.95 and gain.mean() > 1e-2, (gain.min(), gain.mean())
    # the engine's full distribution is the nucleus: tokens outside it have probability 0
    dist = np.exp(batch.logdist_engine_B_T_V[mask])
    np.testing.assert_allclose(dist.sum(-1), 1.0, atol=1e-3)
    assert (dist == 0).any(-1).mean() > 0.5


def test_same_seed_same_samples_other_seed_other_samples(engine, prompts):
    a = engine.generate(_request(prompts[:8], seed=5))
    b = engine.generate(_request(prompts[:8], seed=5))
    c = engine.generate(_request(prompts[:8], seed=6))
    np.testing.assert_array_equal(a.response_ids_B_T, b.response_ids_B_T)
    assert not np.array_equal(a.response_ids_B_T, c.response_ids_B_T)


def test_a_weights_update_through_the_object_store_moves_the_engine(engine, prompts, tiny):
    import ray

    from opdflow.models import load_model
    from opdflow.raycluster import connect
    from opdflow.weights import pack, unpack

    params = SamplingParams(return_logdist=True)
    started = connect(1)
    student_state = load_model(str(tiny.student), "bfloat16").state_dict()
    try:
        teacher_state = load_model(str(tiny.teacher), "bfloat16").state_dict()
        ref = ray.put(pack(teacher_state, 1))
        engine.load_weights(unpack(ray.get(ref)), 1)
        batch = engine.generate(_request(prompts, params, seed=3, version=1))
        assert batch.version == 1
        mask = batch.response_mask_B_T
        t_logp, t_dist = _rescore(tiny.teacher, batch, params)
        _, s_dist = _rescore(tiny.student, batch, params)
        kl_teacher = exact_kl(batch.logdist_engine_B_T_V, t_dist, mask)
        kl_student = exact_kl(batch.logdist_engine_B_T_V, s_dist, mask)
        assert kl_teacher < 5e-3 and kl_teacher < 0.02 * kl_student, (kl_teacher, kl_student)
        assert np.abs(batch.logp_engine_B_T - t_logp)[mask].mean() < 2e-2
        # and back to the student's weights
        engine.load_weights(unpack(ray.get(ray.put(pack(student_state, 2)))), 2)
        back = engine.generate(_request(prompts, params, seed=3, version=2))
        _, s_dist = _rescore(tiny.student, back, params)
        assert exact_kl(back.logdist_engine_B_T_V, s_dist, back.response_mask_B_T) < 1e-3
    finally:
        engine.load_weights(student_state, 0)  # the module's engine stays on the student
        if started:
            ray.shutdown()


def _cpu_fp8_kv() -> bool:
    """vLLM's CPU build has FP8 KV kernels only for x86 with AVX-512 or AMX."""
    if torch.cuda.is_available():
        return True
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


@pytest.mark.skipif(
    not _cpu_fp8_kv(), reason="vLLM's CPU FP8 KV cache needs AVX-512 or AMX (this CPU has neither)"
)
def test_fp8_kv_cache_shows_more_mismatch_than_bf16(engine, make_engine, prompts, tiny):
    from opdflow.engines.vllm_engine import engine_options

    assert engine_options("fp8_kv", 3) == {"kv_cache_dtype": "fp8"}
    params = SamplingParams(return_logdist=True)
    base = engine.generate(_request(prompts, params, seed=21))
    _, base_dist = _rescore(tiny.student, base, params)
    kl_bf16 = exact_kl(base.logdist_engine_B_T_V, base_dist, base.response_mask_B_T)
    fp8 = make_engine("fp8_kv")
    try:
        batch = fp8.generate(_request(prompts, params, seed=21))
    finally:
        del fp8
        gc.collect()
    assert batch.recipe == "fp8_kv"
    _, dist = _rescore(tiny.student, batch, params)
    kl_fp8 = exact_kl(batch.logdist_engine_B_T_V, dist, batch.response_mask_B_T)
    print(f"exact KL vs BF16 rescore: vllm bf16 {kl_bf16:.2e}, vllm fp8_kv {kl_fp8:.2e}")
    assert kl_fp8 > 3 * kl_bf16, (kl_fp8, kl_bf16)
    assert kl_fp8 < 0.1, kl_fp8  # a precision change, not a broken engine


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("bf16", {}),
        ("fp8", {"quantization": "fp8"}),
        ("fp8_kv", {"kv_cache_dtype": "fp8"}),
        (
            "fp8_kv(kv_bf16_layers=[0])",
            {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["0"]},
        ),
        (
            "fp8_kv(kv_bf16_layers=[0,-1])",
            {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["0", "2"]},
        ),
    ],
)
def test_recipe_names_map_to_vllm_options(recipe, expected):
    from opdflow.engines.vllm_engine import engine_options

    assert engine_options(recipe, 3) == expected


@pytest.mark.parametrize(
    "recipe", ["noise(0.1)", "fp9", "fp8_kv(keys=1)", "fp8_kv(keys_only=true)", "nvfp4"]
)
def test_unsupported_recipes_are_refused_by_name(recipe):
    from opdflow.config import ConfigError
    from opdflow.engines.vllm_engine import engine_options

    with pytest.raises(ConfigError, match=r"recipe"):
        engine_options(recipe, 3)


@pytest.mark.gpu
def test_fp8_weights_on_gpu(tiny, tokenizer, prompts):
    """FP8 weights + activations (quantization="fp8"): the CPU build cannot run it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from opdflow.engines.vllm_engine import VLLMEngine

    params = SamplingParams(return_logdist=True)
    kls = {}
    for recipe in ("bf16", "fp8"):
        eng = VLLMEngine(
            str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, recipe=recipe
        )
        batch = eng.generate(_request(prompts, params, seed=21))
        _, dist = _rescore(tiny.student, batch, params)
        kls[recipe] = exact_kl(batch.logdist_engine_B_T_V, dist, batch.response_mask_B_T)
        del eng
        gc.collect()
    assert kls["fp8"] > kls["bf16"] and kls["fp8"] < 0.1, kls
