"""Recipe strings: parsing, canonical text, errors that list the known recipes, GPU mapping."""

import pytest

from opdflow.core.recipe import KNOWN, parse_recipe, with_parts
from opdflow.engines.recipes import vllm_options
from opdflow.errors import ConfigError

EXAMPLES = [
    "bf16",
    "fp8",
    "fp8_kv",
    "fp8_kv(kv_bf16_layers=[0])",
    "fp8_kv(keys_only=true)",
    "fp8_kv(values_only=true)",
    "fp8_kv(scale=unit)",
    "fp8_kv(scale=unit,kv_bf16_layers=[0])",
    "nvfp4",
    "nvfp4(activations=true)",
    "noise(0.15)",
    "noise(sigma=0.1, seed=3, bf16_layers=[1])",
    "fp8(bf16_layers=[0,-1])",
    "fp8(impl=torch)",
    "fp8+fp8_kv",
    "fp8 + fp8_kv(kv_bf16_layers=[0])",
    "nvfp4(layers=[2])",
]


@pytest.mark.parametrize("text", EXAMPLES)
def test_canonical_text_round_trips(text):
    r = parse_recipe(text)
    assert parse_recipe(r.text) == r
    assert " " not in r.text


def test_arguments_are_read_and_typed():
    r = parse_recipe("noise(0.15)")
    assert r.text == "noise(sigma=0.15)" and r.parts[0].arg("sigma") == 0.15
    assert r.parts[0].arg("seed") == 0
    r = parse_recipe("fp8+fp8_kv(kv_bf16_layers=[0], keys_only=true)")
    assert [p.name for p in r.parts] == ["fp8", "fp8_kv"]
    assert r.kv_part.arg("kv_bf16_layers") == (0,) and r.kv_part.arg("keys_only") is True
    assert parse_recipe("fp8(bf16_layers=[0,-1])").parts[0].layer_set(3) == {1}
    assert parse_recipe("fp8_kv(layers=[-1])").parts[0].layer_set(3) == {2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fp9", "unknown recipe 'fp9'; known recipes: bf16, fp8, fp8_kv, nvfp4, noise"),
        ("fp8(", "malformed"),
        ("fp8(foo=1)", "fp8 has no argument 'foo'; allowed: layers, bf16_layers, impl"),
        ("noise", "noise needs sigma"),
        ("noise(-1)", "sigma=-1"),
        ("fp8_kv+fp8_kv", "at most one KV-cache part"),
        ("fp8(bf16_layers=x)", "a list of layer indices"),
        ("fp8_kv(keys_only=1)", "true or false"),
        ("fp8_kv(keys_only=true, values_only=true)", "exclude each other"),
        ("fp8_kv(scale=one)", "scale='one' is not allowed; expected amax or unit"),
        ("fp8(impl=cuda)", "auto or modelopt or torch"),
        ("", "empty"),
    ],
)
def test_bad_recipes_name_the_recipe_and_the_fix(text, message):
    with pytest.raises(ConfigError, match="recipe") as info:
        parse_recipe(text)
    assert message in str(info.value)
    if "unknown" in message:
        assert all(k in str(info.value) for k in KNOWN)


def test_out_of_range_layers_are_refused_at_use():
    with pytest.raises(ConfigError, match="layer 5 out of range for a 3-layer model"):
        parse_recipe("fp8(bf16_layers=[5])").parts[0].layer_set(3)


def test_with_parts_restricts_or_escapes_every_part():
    r = with_parts(parse_recipe("fp8+fp8_kv"), bf16_layers=[1])
    assert r.text == "fp8(bf16_layers=[1])+fp8_kv(kv_bf16_layers=[1])"
    assert with_parts(parse_recipe("fp8_kv"), layers=[0]).text == "fp8_kv(layers=[0])"
    assert with_parts(parse_recipe("bf16"), layers=[0]).text == "bf16"


def test_vllm_mapping_in_one_place():
    assert vllm_options("bf16")["quantization"] is None
    o = vllm_options("fp8(bf16_layers=[0,-1])+fp8_kv", num_layers=4)
    assert o["quantization"] == "fp8" and o["kv_cache_dtype"] == "fp8"
    assert o["ignored_layers"] == [0, 3] and o["exact"]
    assert {"quantizer_name": "*layers.3.*", "enable": False} in o["modelopt_extra"]
    assert o["modelopt_base"] == "FP8_DEFAULT_CFG" and o["modelopt_kv"] == "FP8_KV_CFG"
    assert vllm_options("nvfp4")["modelopt_base"] == "W4A16_NVFP4_CFG"
    assert vllm_options("nvfp4(activations=true)")["quantization"] == "modelopt_fp4"
    kv = vllm_options("fp8_kv(kv_bf16_layers=[0])", num_layers=3)
    assert kv["kv_cache_bf16_layers"] == [0]  # vLLM: kv_cache_dtype_skip_layers
    assert kv["exact"]
    assert not vllm_options("fp8_kv(keys_only=true)", num_layers=3)["exact"]
    assert vllm_options("noise(0.1)")["weight_transform"] == "noise(sigma=0.1)"
    # FP8 KV scales: the prefill's amax by default (VLLMEngine's hooks), vLLM's 1.0 on request
    assert kv["kv_cache_scale"] == "amax" and parse_recipe("fp8_kv").text == "fp8_kv"
    assert vllm_options("fp8_kv(scale=unit)")["kv_cache_scale"] == "unit"
    assert vllm_options("fp8")["kv_cache_scale"] is None
    with pytest.raises(ConfigError, match="need num_layers"):
        vllm_options("fp8(bf16_layers=[0])")
