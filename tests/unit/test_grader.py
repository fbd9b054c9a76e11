"""data.grader = "math" on a DAPO-Math-17k-schema parquet with \\boxed{} answers: right,
wrong, equivalent forms, malformed and empty responses; ground truths that are missing or
unparsable are refused at load naming the file, the row and the column; a slow answer
runs out of time and counts as wrong."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opdflow.errors import ConfigError
from opdflow.inputs.data import load_prompts
from opdflow.inputs.grader import MathGrader, make_grader

GROUND_TRUTHS = ["42", "\\frac{1}{2}", "0.75", "2\\sqrt{3}", "\\frac{\\pi}{2}"]


def _dapo(path, truths):
    pq.write_table(
        pa.table(
            {
                "data_source": ["math_dapo"] * len(truths),
                "prompt": [[{"content": f"Q:{i}+0=", "role": "user"}] for i in range(len(truths))],
                "ability": ["MATH"] * len(truths),
                "reward_model": [
                    {"ground_truth": t, "style": "rule-lighteval/MATH_v2"} for t in truths
                ],
                "extra_info": [{"index": str(i)} for i in range(len(truths))],
            }
        ),
        path,
    )
    return path


@pytest.fixture(scope="module")
def answers(tmp_path_factory, tokenizer):
    path = _dapo(tmp_path_factory.mktemp("dapo") / "dapo.parquet", GROUND_TRUTHS)
    return load_prompts(path, tokenizer, grader=make_grader("math")).answers


# response -> (row of the ground truth it answers, expected grade)
CASES = {
    "right, boxed": ("So the answer is $\\boxed{42}$.", 0, True),
    "right, plain last answer": ("6 times 7 is 42", 0, True),
    "wrong, boxed": ("The answer is \\boxed{41}.", 0, False),
    "boxed beats an earlier number": ("I first thought 41. Final: \\boxed{42}", 0, True),
    "equivalent: decimal for a fraction": ("\\boxed{0.5}", 1, True),
    "equivalent: dfrac shorthand": ("\\boxed{\\dfrac12}", 1, True),
    "equivalent: slash": ("\\boxed{1/2}", 1, True),
    "equivalent: fraction for a decimal": ("\\boxed{\\frac{3}{4}}", 2, True),
    "equivalent: reordered product": ("\\boxed{\\sqrt{3} \\cdot 2}", 3, True),
    "equivalent: sqrt 12": ("\\boxed{\\sqrt{12}}", 3, True),
    "wrong: close but not equal": ("\\boxed{3.4641}", 3, False),
    "equivalent: pi over 2": ("\\boxed{\\pi/2}", 4, True),
    "malformed boxed": ("\\boxed{\\frac{1}{", 1, False),
    "unbalanced braces": ("}}{{ \\boxed{", 0, False),
    "empty": ("", 0, False),
    "whitespace": ("   \n", 2, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_math_grader_on_dapo_ground_truths(case, answers):
    response, row, expected = CASES[case]
    grader = make_grader("math")
    assert grader(response, answers[row]) is expected
    assert grader.timeouts == 0


def test_the_exact_grader_would_miss_equivalent_forms(answers):
    exact = make_grader("exact")
    assert exact("42", answers[0]) and not exact("\\boxed{42}", answers[0])
    assert not exact("\\boxed{0.5}", answers[1])


@pytest.mark.parametrize(
    ("truth", "why"),
    [
        (None, "it is missing"),
        ("", "it is missing"),
        ("\\frac{1}{", "math-verify cannot parse it"),
        ("{", "math-verify cannot parse it"),
    ],
)
def test_missing_or_unparsable_ground_truth_names_file_row_and_column(
    tmp_path, tokenizer, truth, why
):
    path = _dapo(tmp_path / "bad.parquet", ["42", "7", truth])
    with pytest.raises(ConfigError) as exc:
        load_prompts(path, tokenizer, grader=make_grader("math"))
    text = str(exc.value)
    assert text.startswith(f"{path}: row 2, column 'reward_model.ground_truth': ")
    assert why in text and "data.grader = 'math'" in text


def test_answer_column_rows_and_files_without_ground_truth(tmp_path, tokenizer):
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"prompt": ["Q:1+2=", "Q:3+4="], "answer": ["3", None]}), plain)
    for kind in ("exact", "math"):  # a file with answers must have one on every row
        with pytest.raises(ConfigError, match=r"row 1, column 'answer': .*it is missing"):
            load_prompts(plain, tokenizer, grader=make_grader(kind))
    none = tmp_path / "none.parquet"
    pq.write_table(pa.table({"prompt": ["Q:1+2="]}), none)
    assert load_prompts(none, tokenizer, grader=make_grader("exact")).answers == [None]
    with pytest.raises(ConfigError, match=r"has no ground truth .*data.grader = 'math'"):
        load_prompts(none, tokenizer, grader=make_grader("math"))


def test_an_answer_that_runs_out_of_time_counts_as_wrong(monkeypatch):
    import math_verify

    grader = MathGrader(timeout_s=0.2)
    assert grader("\\boxed{42}", "42")

    def stuck(*args, **kwargs):  # a comparison that never ends, as sympy can on bad input
        while True:
            time.sleep(0.01)

    monkeypatch.setattr(math_verify, "verify", stuck)
    assert grader("\\boxed{42}", "42") is False
    assert grader.timeouts == 1


def test_grader_names_are_checked():
    with pytest.raises(ConfigError, match=r"data.grader = 'fuzzy'"):
        make_grader("fuzzy")
