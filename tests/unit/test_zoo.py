"""The tiny build's recipe key and its planted key dimensions."""

from opdflow.config import TaskSpec, TinyModelSpec
from opdflow.testbed.tiny import worked
from opdflow.testbed.zoo import model_config, planted_key_dims, recipe_key


def test_only_the_fields_a_build_uses_are_in_its_key():
    task = TaskSpec(worked=True)
    key = recipe_key(TinyModelSpec(), task)
    assert key == recipe_key(TinyModelSpec(carry_blind_steps=99), task)  # checkpoint student
    blind = TinyModelSpec(student="carry_blind")
    assert recipe_key(blind, task) != key
    assert recipe_key(blind, task) == recipe_key(
        TinyModelSpec(student="carry_blind", student_accuracy=0.9), task
    )
    assert recipe_key(blind, task) != recipe_key(
        TinyModelSpec(student="carry_blind", carry_blind_steps=31), task
    )


def test_portable_kernels_key_their_own_build_and_leave_the_others_keys_alone():
    cfg = worked()
    assert recipe_key(cfg.models.tiny, cfg.data.task) == "4fd0324945d0"  # the demo's, since 2026-12
    cfg.models.tiny.portable_kernels = True
    assert recipe_key(cfg.models.tiny, cfg.data.task) != "4fd0324945d0"


def test_the_planted_bias_sits_on_rotary_dims_that_barely_turn():
    cfg = model_config(TinyModelSpec(), vocab_size=20, pad_id=0, eos_id=1)
    head = cfg.hidden_size // cfg.num_attention_heads
    dims = planted_key_dims(cfg)
    assert len(dims) == len(set(dims)) == cfg.num_key_value_heads * 8
    assert max(dims) < cfg.num_key_value_heads * head
    theta = cfg.rope_parameters["rope_theta"]
    for d in dims:
        pair = (d % head) % (head // 2)  # rotate_half pairs dim j with j + head / 2
        assert 60 * theta ** (-2 * pair / head) < 0.1  # radians over the task's positions
