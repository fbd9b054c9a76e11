"""The tiny task's worked solutions: every column written out, the answer after ":"."""

import numpy as np

from opdflow.testbed.task import (
    alphabet,
    carry_blind_solution,
    is_correct,
    make_problems,
    response_tokens,
    target_text,
    worked_solution,
)


def test_worked_solution_writes_each_column_and_its_carry():
    assert worked_solution("Q:123+459=") == "3+9+0=12,2+5+1=08,1+4+0=05:582"
    assert worked_solution("Q:999+999=") == "9+9+0=18,9+9+1=19,9+9+1=19:1998"
    assert worked_solution("Q:000+000=") == "0+0+0=00,0+0+0=00,0+0+0=00:0"


def test_worked_responses_check_their_final_answer_and_fit_the_token_bound():
    prompts, answers = make_problems(500, 3, np.random.default_rng(0))
    longest = 0
    for p, a in zip(prompts, answers):
        text = target_text(p, a, worked=True)
        assert is_correct(text, a) and set(text) <= set(alphabet(True))
        longest = max(longest, len(text) + 1)  # + EOS
    assert longest <= response_tokens(3, worked=True)
    assert not is_correct("3+9+0=12,2+5+1=08,1+4+0=05:581", "582")
    assert is_correct("582", "582") and target_text("Q:1+2=", "3", worked=False) == "3"
    assert "," not in alphabet(False)  # the plain task's tokenizer is unchanged


def test_the_carry_blind_solution_is_right_exactly_where_no_column_overflows():
    assert carry_blind_solution("Q:123+459=") == "3+9+0=12,2+5+0=07,1+4+0=05:572"
    assert carry_blind_solution("Q:999+001=") == "9+1+0=10,9+0+0=09,9+0+0=09:990"
    prompts, answers = make_problems(500, 3, np.random.default_rng(1))
    for p, a in zip(prompts, answers):
        x, y = p.removeprefix("Q:").removesuffix("=").split("+")
        carries = any(int(dx) + int(dy) >= 10 for dx, dy in zip(x[1:], y[1:]))
        text = carry_blind_solution(p)
        assert is_correct(text, a) == (not carries), p
        assert len(text) < response_tokens(3, worked=True) and set(text) <= set(alphabet(True))
