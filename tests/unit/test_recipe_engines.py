"""Recipes on the real tiny student: Model Optimizer vs emulation, the KV cache, the layers."""

import pytest
import torch
import torch.nn.functional as F

from opdflow.engines.fakequant import E4M3_MAX, fake_fp8, fp8_scale
from opdflow.engines.kvcache import FP8WriteLayer, make_cache, quantized_cache
from opdflow.engines.torch_engine import TorchEngine
from opdflow.inputs.models import load_model


@pytest.fixture(scope="module")
def inputs(tiny, tokenizer):
    from opdflow.inputs.data import load_prompts

    p = load_prompts(tiny.heldout, tokenizer, limit=16)
    return torch.tensor(p.token_ids)  # the tiny prompts all have the same length


def _engine(tiny, tokenizer, recipe):
    return TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, recipe)


def _fp8_step(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """One E4M3 step at each element of `x` (the grid's spacing in its binade, times the scale)."""
    _, exp = torch.frexp((x.float() / scale).abs().clamp_max(E4M3_MAX))
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), (exp - 1).clamp_min(-6) - 3) * scale


def _within_one_fp8_step(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> bool:
    """Each element of `got` is the reference's FP8 value or a neighbour on its grid (on the
    grid up to float rounding of the scale: quantizing it with the reference scale keeps it)."""
    got, ref = got.float(), ref.float()
    on_grid = torch.allclose(fake_fp8(got, scale), got, rtol=1e-5, atol=0)
    bigger = torch.maximum(got.abs(), ref.abs())
    return on_grid and bool(((got - ref).abs() <= _fp8_step(bigger, scale) * (1 + 1e-3)).all())


@torch.no_grad()
def test_modelopt_fp8_and_the_torch_emulation_are_within_one_fp8_step_of_the_reference(
    tiny, tokenizer, inputs, monkeypatch
):
    """The reference is fake_fp8 (per-tensor E4M3, scale amax / 448) of every decoder linear's
    weight and input. Not bit for bit: a one-ulp difference in a scale moves an operand that
    sits on a rounding boundary to the neighbouring FP8 value, so each implementation's
    quantized operands are within one FP8 step of the reference's, and its forward is the
    linear of exactly those operands."""
    pytest.importorskip("modelopt.torch.quantization")
    monkeypatch.setenv("OPDFLOW_BF16_COMPUTE", "float32")  # float rounding far below a step
    mo = _engine(tiny, tokenizer, "fp8(impl=modelopt)")
    emu = _engine(tiny, tokenizer, "fp8(impl=torch)")
    assert type(mo.model.model.layers[0].self_attn.q_proj).__name__ == "QuantLinear"
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, mo.compute_dtype)  # bf16-rounded inputs in the engines' dtype
    linears = [(n, m) for n, m in mo.model.named_modules() if n.endswith("proj")]
    for name, lin in linears:
        h = (torch.randn(2, 5, lin.in_features, generator=gen) * 2).bfloat16().to(dtype)
        w = lin.weight  # modelopt quantizes on the fly: the engine holds the loaded weights
        ref_w, ref_h = fake_fp8(w), fake_fp8(h)
        mo_w, mo_h = lin.weight_quantizer(w), lin.input_quantizer(h)
        assert _within_one_fp8_step(mo_w, ref_w, fp8_scale(w)), name
        assert _within_one_fp8_step(mo_h, ref_h, fp8_scale(h)), name
        assert torch.allclose(lin(h), F.linear(mo_h, mo_w, lin.bias), rtol=1e-5, atol=1e-6), name
        e = emu.model.get_submodule(name)
        assert _within_one_fp8_step(e.weight, ref_w, fp8_scale(w)), name
        assert torch.allclose(e(h), F.linear(ref_h, e.weight, e.bias), rtol=1e-5, atol=1e-6), name
    # the whole model: the two implementations are closer to each other than to BF16
    ref = load_model(str(tiny.student))
    lp_mo = torch.log_softmax(mo.model(input_ids=inputs).logits.float(), -1)
    lp_emu = torch.log_softmax(emu.model(input_ids=inputs).logits.float(), -1)
    lp_ref = torch.log_softmax(ref(input_ids=inputs).logits.float(), -1)
    kl_agree = (lp_mo.exp() * (lp_mo - lp_emu)).sum(-1).mean().item()
    kl_fp8 = (lp_mo.exp() * (lp_mo - lp_ref)).sum(-1).mean().item()
    assert 0 <= kl_agree < kl_fp8, (kl_agree, kl_fp8)
    # reloading weights keeps the modelopt engine right (weight amax follows the weights)
    mo.load_weights(ref.state_dict(), version=1)
    lp_again = torch.log_softmax(mo.model(input_ids=inputs).logits.float(), -1)
    assert torch.allclose(lp_again, lp_mo, atol=1e-5)


@torch.no_grad()
def test_weight_recipes_touch_only_the_chosen_layers(tiny, tokenizer):
    ref = load_model(str(tiny.student)).state_dict()
    eng = _engine(tiny, tokenizer, "nvfp4(layers=[1])")
    got = eng.model.state_dict()
    for name, w in ref.items():
        changed = not torch.equal(got[name], w)
        assert changed == (".layers.1." in name and name.endswith("proj.weight")), name
    noisy = _engine(tiny, tokenizer, "noise(0.1, bf16_layers=[0])").model.state_dict()
    assert torch.equal(
        noisy["model.layers.0.mlp.up_proj.weight"], ref["model.layers.0.mlp.up_proj.weight"]
    )
    assert not torch.equal(
        noisy["model.layers.2.mlp.up_proj.weight"], ref["model.layers.2.mlp.up_proj.weight"]
    )


def _on_grid(x: torch.Tensor, scale: torch.Tensor) -> bool:
    """Stored states are E4M3 values times the scale, in bf16: quantizing them is a no-op."""
    return bool(torch.equal(fake_fp8(x, scale), x))


@torch.no_grad()
@pytest.mark.parametrize(("keys", "values"), [(True, True), (True, False), (False, True)])
def test_fp8_kv_cache_stores_e4m3_states_in_the_chosen_layers(tiny, inputs, keys, values):
    model = load_model(str(tiny.student))
    cache = quantized_cache(model.config, {0}, keys=keys, values=values)
    model(input_ids=inputs[:, :-1], use_cache=True, cache=cache)
    model(input_ids=inputs[:, -1:], use_cache=True, cache=cache)
    layer0, layer1 = cache.layers[0], cache.layers[1]
    assert isinstance(layer0, FP8WriteLayer) and not isinstance(layer1, FP8WriteLayer)
    assert layer0.keys.shape[-2] == inputs.shape[1]  # prefill and the decode write
    if keys:
        assert _on_grid(layer0.keys, layer0.key_scale)
        assert not _on_grid(layer1.keys, layer0.key_scale)
    else:
        assert layer0.key_scale is None
    if values:
        assert _on_grid(layer0.values, layer0.value_scale)
    else:
        assert layer0.value_scale is None


def test_recipe_through_the_engine_builds_the_quantizing_cache(tiny, tokenizer):
    eng = _engine(tiny, tokenizer, "fp8_kv(kv_bf16_layers=[0])")
    cache = make_cache(eng.recipe, eng.model.config)
    assert [type(c).__name__ for c in cache.layers] == [
        "DynamicLayer",
        "FP8WriteLayer",
        "FP8WriteLayer",
    ]
    assert make_cache(_engine(tiny, tokenizer, "fp8").recipe, eng.model.config) is None


@torch.no_grad()
def test_fp8_kv_scale_is_the_prefill_amax_or_unit(tiny, tokenizer, inputs):
    """fp8_kv: amax / 448 of the prefill, frozen; fp8_kv(scale=unit): 1.0, as vLLM does."""
    model = load_model(str(tiny.student))
    scales = {}
    for recipe in ("fp8_kv", "fp8_kv(scale=unit)"):
        cache = make_cache(_engine(tiny, tokenizer, recipe).recipe, model.config)
        out = model(input_ids=inputs[:, :-1], use_cache=True, cache=cache)
        layer = cache.layers[2]
        prefill_keys = layer.keys.clone()
        model(input_ids=inputs[:, -1:], use_cache=True, cache=out.past_key_values)
        scales[recipe] = float(layer.key_scale), float(layer.value_scale)
        assert _on_grid(layer.keys, layer.key_scale) and _on_grid(layer.values, layer.value_scale)
        if recipe == "fp8_kv":  # the stored prefill's largest key sits at the top of the grid
            assert float(prefill_keys.abs().amax()) == pytest.approx(
                E4M3_MAX * scales[recipe][0], rel=1e-2
            )
    assert scales["fp8_kv(scale=unit)"] == (1.0, 1.0)
    assert all(0 < s < 0.5 for s in scales["fp8_kv"])  # tiny keys/values: |x| << 448
