"""The synthetic task: zero-padded addition written as text, with checkable answers.

Worked (the default): "Q:123+459=" -> "3+9+0=12,2+5+1=08,1+4+0=05:582", each column's
digits, carry in and two-digit sum from the right, then the answer after ":". Responses
are about 30 tokens, so a wrong carry early shifts every later prefix (the regime where
rollout mismatch compounds); plain: "Q:123+045=" -> "168". Small enough for a 3-layer
model to learn in a minute on a CPU, hard enough that an early checkpoint is a clearly
weaker student than a late one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ALPHABET = "0123456789+=Q:"


def alphabet(worked: bool) -> str:
    """The task's characters (worked solutions add the column separator ",")."""
    return ALPHABET + "," if worked else ALPHABET


def make_problems(n: int, digits: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """n random problems: prompts "Q:aaa+bbb=" and answers (the sum, no padding)."""
    hi = 10**digits
    a = rng.integers(0, hi, size=n)
    b = rng.integers(0, hi, size=n)
    prompts = [f"Q:{x:0{digits}d}+{y:0{digits}d}=" for x, y in zip(a, b)]
    answers = [str(int(x) + int(y)) for x, y in zip(a, b)]
    return prompts, answers


def worked_solution(prompt: str) -> str:
    """The worked response to "Q:aaa+bbb=": per column from the right "x+y+carry=ss", then ":sum"."""
    x, y = prompt.removeprefix("Q:").removesuffix("=").split("+")
    columns, carry = [], 0
    for dx, dy in zip(reversed(x), reversed(y)):
        s = int(dx) + int(dy) + carry
        columns.append(f"{dx}+{dy}+{carry}={s:02d}")
        carry = s // 10
    return ",".join(columns) + ":" + str(int(x) + int(y))


def carry_blind_solution(prompt: str) -> str:
    """The worked solution of a solver that never carries: every carry in is 0, each column
    keeps its own two-digit sum, and the answer is what those columns spell ("Q:123+459=" ->
    "3+9+0=12,2+5+0=07,1+4+0=05:572"). Right wherever no column overflows."""
    x, y = prompt.removeprefix("Q:").removesuffix("=").split("+")
    sums = [int(dx) + int(dy) for dx, dy in zip(reversed(x), reversed(y))]
    columns = [f"{dx}+{dy}+0={s:02d}" for dx, dy, s in zip(reversed(x), reversed(y), sums)]
    answer = str(sums[-1]) + "".join(str(s % 10) for s in reversed(sums[:-1]))
    return ",".join(columns) + ":" + str(int(answer))


def target_text(prompt: str, answer: str, worked: bool) -> str:
    """The supervised response of a problem: the worked solution, or the bare answer."""
    return worked_solution(prompt) if worked else answer


def response_tokens(digits: int, worked: bool) -> int:
    """Longest response in tokens (characters), EOS included."""
    answer = digits + 1
    return (9 * digits + answer if worked else answer) + 1


def split_problems(
    num_train: int, num_heldout: int, digits: int, seed: int
) -> tuple[tuple[list[str], list[str]], tuple[list[str], list[str]]]:
    """Disjoint train and held-out problem sets, deterministic in the seed."""
    rng = np.random.default_rng(seed)
    prompts, answers = make_problems(2 * (num_train + num_heldout), digits, rng)
    seen: set[str] = set()
    rows = []
    for p, a in zip(prompts, answers):
        if p not in seen:
            seen.add(p)
            rows.append((p, a))
    if len(rows) < num_train + num_heldout:
        raise ValueError(
            f"only {len(rows)} distinct {digits}-digit problems; lower num_train/num_heldout"
        )
    held = rows[:num_heldout]
    train = rows[num_heldout : num_heldout + num_train]
    return ([p for p, _ in train], [a for _, a in train]), (
        [p for p, _ in held],
        [a for _, a in held],
    )


def write_parquet(path: Path, prompts: list[str], answers: list[str]) -> None:
    """Write a prompt file in opdflow's plain schema: `prompt` and `answer` string columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": prompts, "answer": answers}), path)


def final_answer(response: str) -> str:
    """What a response answers: the text after its last ":" (worked), else all of it."""
    return response.rsplit(":", 1)[-1].strip()


def is_correct(response: str, answer: str | None) -> bool:
    """Exact match of the response's final answer with the reference answer."""
    return answer is not None and final_answer(response) == str(answer).strip()


def decoded_responses(batch, tok) -> list[str]:
    """Each response of a RolloutBatch as text (EOS and padding dropped)."""
    return batch.response_texts(lambda ids: tok.decode([i for i in ids if i != tok.eos_token_id]))


def correctness(batch, tok, grader=None, texts: list[str] | None = None) -> np.ndarray:
    """0/1 per response of a RolloutBatch: does its decoded text (EOS dropped) answer right?
    `grader(text, answer) -> bool` (grader.py; default: is_correct, the exact rule)."""
    grade = grader or is_correct
    texts = decoded_responses(batch, tok) if texts is None else texts
    return np.array([grade(t, a) for t, a in zip(texts, batch.answers)], dtype=np.float32)
