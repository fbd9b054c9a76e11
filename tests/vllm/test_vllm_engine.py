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

from opdflow.core.mismatch import exact_kl, k1
from opdflow.engines.base import GenerationRequest, SamplingParams


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
    from opdflow.compute.scoring import batch_tensors
    from opdflow.engines.torch_engine import sampling_logdist
    from opdflow.inputs.models import load_model

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

    from opdflow.cluster.connection import connect
    from opdflow.inputs.models import load_model
    from opdflow.weights.version import pack, views

    params = SamplingParams(return_logdist=True)
    started = connect(1)
    student_state = load_model(str(tiny.student), "bfloat16").state_dict()
    try:
        teacher_state = load_model(str(tiny.teacher), "bfloat16").state_dict()
        ref = ray.put(pack(teacher_state, 1))
        engine.load_weights(views(ray.get(ref)), 1)  # zero-copy views
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
        engine.load_weights(views(ray.get(ray.put(pack(student_state, 2)))), 2)
        back = engine.generate(_request(prompts, params, seed=3, version=2))
        _, s_dist = _rescore(tiny.student, back, params)
        assert exact_kl(back.logdist_engine_B_T_V, s_dist, back.response_mask_B_T) < 1e-3
    finally:
        engine.load_weights(student_state, 0)  # the module's engine stays on the student
        if started:
            ray.shutdown()


def test_defaults_on_the_cpu_build_are_eager_with_prefix_caching(engine):
    """CUDA graphs are a GPU setting: the CPU build runs eager; prefix caching is on."""
    config = engine.llm.llm_engine.vllm_config
    assert engine.options == {
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "uni",
    }
    assert config.model_config.enforce_eager and config.cache_config.enable_prefix_caching
    assert config.parallel_config.tensor_parallel_size == 1


def test_the_prefix_cache_serves_repeats_and_is_dropped_at_a_weights_update(
    engine, tiny, tokenizer
):
    """A prompt's KV blocks are reused by the next request for it; after a weights update
    none are (they hold the old weights' keys and values), and logprobs follow the new
    weights. The prompt spans a full cache block (128 tokens on the CPU build)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    from opdflow.inputs.models import load_model

    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    long = (tokenizer.encode("Q:123+045=") * 40)[: block + 40]
    sp = VSamplingParams(n=1, max_tokens=2, detokenize=False, seed=0)

    def cached() -> int:
        out = engine.llm.generate([TokensPrompt(prompt_token_ids=long)], sp, use_tqdm=False)
        return int(out[0].num_cached_tokens)

    student = load_model(str(tiny.student), "bfloat16").state_dict()
    try:
        cached()
        assert cached() >= block  # a repeat reads the cached block
        engine.load_weights(load_model(str(tiny.teacher), "bfloat16").state_dict(), 1)
        assert cached() == 0  # the update dropped it
        params = SamplingParams(return_logdist=True)
        batch = engine.generate(_request([long], params, seed=9, n=4, version=1))
        _, dist = _rescore(tiny.teacher, batch, params)
        assert exact_kl(batch.logdist_engine_B_T_V, dist, batch.response_mask_B_T) < 5e-3
    finally:
        engine.load_weights(student, 0)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny, make_engine):
    """`opdflow export` of a run directory whose learner checkpoint moved off the student,
    and a VLLMEngine on it (alive until the module ends: see fp8_engines)."""
    from opdflow.config import PipelineConfig, TrainConfig
    from opdflow.engines.vllm_engine import VLLMEngine
    from opdflow.record import checkpoint
    from opdflow.record.export import export_run
    from opdflow.record.rundir import RunDir
    from opdflow.stages.learner import Learner

    run = RunDir.create(PipelineConfig(name="x"), tmp_path_factory.mktemp("x") / "run")
    learner = Learner(str(tiny.student), TrainConfig())
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    root = checkpoint.checkpoints_dir(run.path)
    staging = checkpoint.staging_dir(root, 1)
    learner.save_checkpoint(str(staging))
    checkpoint.commit(root, staging, 1, {}, keep=1)
    out = export_run(run.path, run.path / "hf")
    eng = VLLMEngine(str(out), 0, 1)
    yield out, eng
    del eng
    gc.collect()


def test_an_exported_run_loads_in_vllm_and_generates_its_weights(exported, prompts, tiny):
    out, eng = exported
    params = SamplingParams(return_logdist=True)
    batch = eng.generate(_request(prompts[:16], params, seed=2))
    assert batch.num_tokens > 50
    mask = batch.response_mask_B_T
    _, exported_dist = _rescore(out, batch, params)
    _, student_dist = _rescore(tiny.student, batch, params)
    kl = exact_kl(batch.logdist_engine_B_T_V, exported_dist, mask)
    assert kl < 1e-3 and kl < 0.1 * exact_kl(batch.logdist_engine_B_T_V, student_dist, mask)


def _cpu_fp8_kv() -> bool:
    """vLLM's CPU build has FP8 KV kernels only for x86 with AVX-512 or AMX."""
    if torch.cuda.is_available():
        return True
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


FP8_KV = ("fp8_kv", "fp8_kv(scale=unit)")
"""The two FP8 KV scale rules (recipes.py): the prefill's amax (default) and vLLM's 1.0."""
needs_fp8_kv = pytest.mark.skipif(
    not _cpu_fp8_kv(), reason="vLLM's CPU FP8 KV cache needs AVX-512 or AMX (this CPU has neither)"
)


def test_a_weights_update_over_a_collective_pair_reaches_the_worker(engine, prompts, tiny):
    """The engine's worker joins its own gloo pair with a learner-side Publisher (here a
    thread standing in for the learner actor) and reloads from the tensors of what it
    received, bucket by bucket (small buckets here: many per version, tensors straddling
    them)."""
    import threading

    from opdflow.inputs.models import load_model
    from opdflow.weights.cast import bf16_entries, write_bf16
    from opdflow.weights.publisher import Publisher
    from opdflow.weights.transport import Collective

    params = SamplingParams(return_logdist=True)
    student_state = load_model(str(tiny.student), "bfloat16").state_dict()
    teacher = load_model(str(tiny.teacher), "float32").state_dict()
    bucket = 2**16
    pub = Publisher(Collective(bucket_bytes=bucket, timeout_s=60), torch.device("cpu"))
    packed = pub.buffer(5, bf16_entries(teacher))
    write_bf16(teacher, packed)
    handle = pub.hold(packed, source=None)
    assert handle.nbytes > 8 * bucket
    try:
        owners = engine.pair_owners()
        keys = [f"{o}/k" for o in owners]
        opened = [threading.Thread(target=pub.open_pair, args=(k, o)) for k, o in zip(keys, owners)]
        for t in opened:
            t.start()
        engine.join(handle.address, keys, handle.backend, 60)
        for t in opened:
            t.join()
        sends = threading.Thread(target=pub.send, args=(5, keys))
        sends.start()
        engine.receive(5, handle.specs, handle.nbytes, bucket)
        sends.join()
        batch = engine.generate(_request(prompts, params, seed=3, version=5))
        assert batch.version == 5
        t_logp, _ = _rescore(tiny.teacher, batch, params)
        mask = batch.response_mask_B_T
        assert np.abs(batch.logp_engine_B_T - t_logp)[mask].mean() < 2e-2
    finally:
        engine.load_weights(student_state, 0)  # the module's engine stays on the student


@pytest.fixture(scope="module")
def fp8_engines(make_engine):
    """A vLLM engine per FP8 KV scale rule, built together: this vLLM build cannot start an
    engine in a process after another one was torn down ("pipeline model parallel group is
    not initialized"), so both live until the module ends."""
    engines = {recipe: make_engine(recipe) for recipe in FP8_KV}
    yield engines
    engines.clear()
    gc.collect()


def _d_exact(batch, tiny, params) -> float:
    """D of a batch: exact KL(engine || BF16 student) on the engine's own tokens."""
    _, dist = _rescore(tiny.student, batch, params)
    return exact_kl(batch.logdist_engine_B_T_V, dist, batch.response_mask_B_T)


@needs_fp8_kv
def test_fp8_kv_d_agrees_between_the_torch_emulation_and_vllm(
    engine, fp8_engines, prompts, tiny, tokenizer
):
    """Both scale rules mean the same in both engines: the scales vLLM ends up with are the
    emulation's, and so is the mismatch D they cause (same prompts, each engine's samples)."""
    from opdflow.core.recipe import parse_recipe
    from opdflow.engines.kvcache import make_cache
    from opdflow.engines.torch_engine import TorchEngine
    from opdflow.engines.vllm_settings import engine_options

    assert engine_options("fp8_kv", 3) == {"kv_cache_dtype": "fp8"}
    assert engine_options("fp8_kv(scale=unit)", 3) == {"kv_cache_dtype": "fp8"}
    params = SamplingParams(return_logdist=True)
    request = _request(prompts, params, seed=21, n=8)
    d_bf16 = _d_exact(engine.generate(request), tiny, params)
    torch_bf16 = TorchEngine(
        str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, recipe="bf16"
    )
    d = {"bf16": (_d_exact(torch_bf16.generate(request), tiny, params), d_bf16)}
    scales = {}
    for recipe, vllm_fp8 in fp8_engines.items():
        emulation = TorchEngine(
            str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, recipe=recipe
        )
        batch = vllm_fp8.generate(request)
        assert batch.recipe == recipe
        d[recipe] = (
            _d_exact(emulation.generate(request), tiny, params),
            _d_exact(batch, tiny, params),
        )
        scales[recipe] = vllm_fp8.llm.collective_rpc("opdflow_kv_scales")[0]
    print(
        "D exact (torch emulation, vllm): "
        + ", ".join(f"{r} ({a:.2e}, {b:.2e})" for r, (a, b) in d.items())
    )
    del d["bf16"]
    # the scales: 1.0 for unit; for amax, the emulation's rule on the same prefill
    assert set(scales["fp8_kv(scale=unit)"].values()) == {(1.0, 1.0)}
    model = emulation.model  # the emulation's cache after the same prefill
    cache = make_cache(parse_recipe("fp8_kv"), model.config)
    ids = torch.tensor([list(p) for p in prompts for _ in range(8)])
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{emulation._cache_kw: cache})
    for i, (k_scale, v_scale) in enumerate(scales["fp8_kv"].values()):
        layer = cache.layers[i]
        assert k_scale == pytest.approx(float(layer.key_scale), rel=0.05), (i, k_scale)
        assert v_scale == pytest.approx(float(layer.value_scale), rel=0.05), (i, v_scale)
    # D: a precision change well above the bf16 engine's, the same in both engines up to
    # sampling noise (~1k tokens each)
    for recipe, (d_torch, d_vllm) in d.items():
        assert d_vllm > 3 * d_bf16 and d_torch > 3 * d_bf16, (recipe, d_torch, d_vllm, d_bf16)
        assert 1 / 3 < d_vllm / d_torch < 3, (recipe, d_torch, d_vllm)
        assert d_vllm < 0.1, d_vllm  # not a broken engine


@needs_fp8_kv
def test_fp8_kv_amax_scales_follow_a_weights_update(fp8_engines, prompts, tiny):
    """The hooks outlive vLLM's weight reload: each generation rescales from its prefill."""
    from opdflow.inputs.models import load_model

    eng = fp8_engines["fp8_kv"]
    student = load_model(str(tiny.student), "bfloat16").state_dict()
    teacher = load_model(str(tiny.teacher), "bfloat16").state_dict()
    request = _request(prompts[:8], seed=4)
    try:
        eng.generate(request)
        before = eng.llm.collective_rpc("opdflow_kv_scales")[0]
        eng.load_weights(teacher, 1)
        eng.generate(request)
        after = eng.llm.collective_rpc("opdflow_kv_scales")[0]
    finally:
        eng.load_weights(student, 0)
    assert before.keys() == after.keys() and len(before) == 3
    assert all(1.0 not in pair for pair in [*before.values(), *after.values()])
    assert before != after  # the teacher's keys and values have other ranges


def test_cpu_fp8_kv_write_rounds_toward_zero():
    """Why vLLM's CPU D is ~1.5x the emulation's under both scale rules: its cache write
    truncates to E4M3 (round toward zero), where the emulation, torch's float8 cast and
    GPU conversions round to nearest even. Checked on the kernel itself, not an engine."""
    import vllm._custom_ops as ops

    from opdflow.engines.fakequant import fake_fp8

    if not _cpu_fp8_kv() or torch.cuda.is_available():
        pytest.skip("vLLM's CPU FP8 KV kernel needs AVX-512 or AMX (and no GPU build)")
    gen = torch.Generator().manual_seed(0)
    key = (torch.randn(32, 1, 32, generator=gen) * 3).bfloat16()
    cache = torch.zeros(1, 1, 64, 32, dtype=torch.uint8)  # [blocks, kv heads, 2 x block, head]
    k_cache, v_cache = cache.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(
        key, key, k_cache, v_cache, torch.arange(32), "vec", 0.5, 0.5, "fp8"
    )
    stored = (k_cache.reshape(-1).view(torch.float8_e4m3fn).float() * 0.5).sort().values
    x = key.float().reshape(-1) / 0.5
    _, exp = torch.frexp(x)
    step = torch.ldexp(torch.ones_like(x), (exp - 1).clamp_min(-6) - 3)
    truncated = (torch.trunc(x / step) * step * 0.5).sort().values
    nearest = fake_fp8(key.float(), 0.5).reshape(-1).sort().values
    assert torch.equal(stored, truncated)  # (the layout is the kernel's: compare value sets)
    assert not torch.equal(stored, nearest)


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
    from opdflow.engines.vllm_settings import engine_options

    assert engine_options(recipe, 3) == expected


@pytest.mark.parametrize(
    "recipe", ["noise(0.1)", "fp9", "fp8_kv(keys=1)", "fp8_kv(keys_only=true)", "nvfp4"]
)
def test_unsupported_recipes_are_refused_by_name(recipe):
    from opdflow.engines.vllm_settings import engine_options
    from opdflow.errors import ConfigError

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
