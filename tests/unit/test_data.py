import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opdflow.errors import ConfigError
from opdflow.inputs.data import PromptSampler, load_prompts


def test_plain_prompt_column_with_answers(tmp_path, tokenizer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["Q:1+2=", "Q:3+4="], "answer": ["3", "7"]}), path)
    ps = load_prompts(path, tokenizer)
    assert ps.texts == ["Q:1+2=", "Q:3+4="]
    assert ps.answers == ["3", "7"]
    assert tokenizer.decode(ps.token_ids[1]) == "Q:3+4="


def test_dapo_math_schema_chat_messages_and_reward_model(tmp_path, tokenizer):
    path = tmp_path / "dapo.parquet"
    table = pa.table(
        {
            "data_source": ["math_dapo"],
            "prompt": [[{"content": "Q:12+30=", "role": "user"}]],
            "ability": ["MATH"],
            "reward_model": [{"ground_truth": "42", "style": "rule-lighteval/MATH_v2"}],
            "extra_info": [{"index": "0"}],
        }
    )
    pq.write_table(table, path)
    ps = load_prompts(path, tokenizer)
    assert ps.texts == ["Q:12+30="]  # rendered with the tokenizer's chat template
    assert ps.answers == ["42"]


def test_schema_errors_name_the_file_and_the_fix(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match=r"prompt file .*nope\.parquet not found"):
        load_prompts(tmp_path / "nope.parquet", tokenizer)
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ConfigError, match=r"bad\.parquet is not a readable parquet file"):
        load_prompts(bad, tokenizer)
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"question": ["x"]}), nocol)
    with pytest.raises(
        ConfigError, match=r"nocol\.parquet has no 'prompt' column \(columns: question\)"
    ):
        load_prompts(nocol, tokenizer)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    with pytest.raises(ConfigError, match="has no rows"):
        load_prompts(empty, tokenizer)
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"prompt": [1, 2]}), wrong)
    with pytest.raises(ConfigError, match=r"row 0 of column 'prompt' is int"):
        load_prompts(wrong, tokenizer)
    long = tmp_path / "long.parquet"
    pq.write_table(pa.table({"prompt": ["1" * 40]}), long)
    with pytest.raises(
        ConfigError, match=r"row 0 has 40 prompt tokens > data\.max_prompt_tokens=10"
    ):
        load_prompts(long, tokenizer, max_prompt_tokens=10)


def test_sampler_is_deterministic_and_covers_an_epoch():
    s = PromptSampler(size=10, per_step=5, seed=3)
    assert s.rows_for(0) == PromptSampler(10, 5, 3).rows_for(0)
    assert sorted(s.rows_for(0) + s.rows_for(1)) == list(range(10))
    with pytest.raises(ConfigError, match="prompts_per_step=11 exceeds"):
        PromptSampler(size=10, per_step=11, seed=0)
