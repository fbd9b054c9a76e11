"""Prompt sets from parquet: the tiny task's files and real ones with the same code.

Accepted schemas: a `prompt` string column, or a `prompt` column of chat-message lists
({role, content}, DAPO-Math-17k's schema) rendered with the tokenizer's chat template.
Reference answers come from an `answer` column or DAPO's `reward_model.ground_truth`;
with a grader (grader.py) every row's reference is checked at load, and a missing or
unparsable one is refused naming the file, the row and the column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opdflow.errors import ConfigError


@dataclass(frozen=True)
class PromptSet:
    """Tokenised prompts of one file, in file order."""

    path: str
    texts: list[str]
    answers: list[str | None]
    token_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.texts)


def _render(value: Any, tokenizer, path: Path, row: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list | np.ndarray) and all(
        isinstance(m, dict) and "content" in m for m in value
    ):
        messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in value]
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return "\n".join(m["content"] for m in messages)
    raise ConfigError(
        f"{path}: row {row} of column 'prompt' is {type(value).__name__}; expected a string "
        "or a list of {role, content} chat messages"
    )


def answer_column(columns: list[str]) -> str | None:
    """Where a file's reference answers are: "answer", DAPO's "reward_model.ground_truth",
    or None."""
    if "answer" in columns:
        return "answer"
    return "reward_model.ground_truth" if "reward_model" in columns else None


def _answer(row: dict[str, Any], column: str | None) -> str | None:
    if column == "answer":
        value = row.get("answer")
    elif column is not None:
        rm = row.get("reward_model")
        value = rm.get("ground_truth") if isinstance(rm, dict) else None
    else:
        value = None
    return None if value is None else str(value)


def check_answers(path: Path, answers: list[str | None], column: str | None, grader: Any) -> None:
    """Every row's reference answer can serve `grader` (grader.make_grader), or a ConfigError
    naming the file, the first bad row and the column. A file without an answer column
    passes for the "exact" grader (accuracy is then n/a), not for "math"."""
    field = f"data.grader = {grader.kind!r}"
    if column is None:
        if grader.kind == "exact":
            return
        raise ConfigError(
            f"prompt file {path} has no ground truth ({field} needs an 'answer' column or "
            "DAPO's reward_model.ground_truth for every row); add one, or set data.grader=exact"
        )
    for i, answer in enumerate(answers):
        why = grader.check_ground_truth(answer)
        if why is not None:
            raise ConfigError(
                f"{path}: row {i}, column '{column}': ground truth {answer!r} is not usable "
                f"({why}; {field}); write the reference answer there (e.g. '42' or "
                "'\\frac{1}{2}') or drop the row"
            )


def load_prompts(
    path: str | Path,
    tokenizer,
    max_prompt_tokens: int = 512,
    limit: int | None = None,
    grader: Any = None,
) -> PromptSet:
    """Read and tokenise a prompt parquet file; errors name the file, the column and the fix.
    With a grader (grader.make_grader), also check every row's reference answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"prompt file {path} not found (data.train / data.heldout: a parquet path or 'tiny')"
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError(f"prompt file {path} is not a readable parquet file: {exc}") from exc
    if "prompt" not in table.column_names:
        raise ConfigError(
            f"prompt file {path} has no 'prompt' column (columns: {', '.join(table.column_names) or 'none'}); "
            "write prompts as a string column 'prompt' or a chat-message list column 'prompt'"
        )
    if table.num_rows == 0:
        raise ConfigError(f"prompt file {path} has no rows")
    if limit is not None:
        table = table.slice(0, limit)
    rows = table.to_pylist()
    texts = [_render(r["prompt"], tokenizer, path, i) for i, r in enumerate(rows)]
    column = answer_column(table.column_names)
    answers = [_answer(r, column) for r in rows]
    if grader is not None:
        check_answers(path, answers, column, grader)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for i, row_ids in enumerate(ids):
        if not row_ids:
            raise ConfigError(f"{path}: row {i} has an empty prompt")
        if len(row_ids) > max_prompt_tokens:
            raise ConfigError(
                f"{path}: row {i} has {len(row_ids)} prompt tokens > data.max_prompt_tokens={max_prompt_tokens}; "
                "raise data.max_prompt_tokens or drop the row"
            )
    return PromptSet(str(path), texts, answers, [list(r) for r in ids])


def heldout_has_answers(heldout: str) -> bool | None:
    """Whether a held-out prompt set (`data.heldout`) carries reference answers, so that
    held-out accuracy means something: "tiny" always does; a parquet file does when it has
    an `answer` or `reward_model` column. None when the file cannot be read here (a report
    made on another machine than the run)."""
    if heldout == "tiny":
        return True
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(heldout).names
    except (pa.ArrowInvalid, OSError):
        return None
    return "answer" in names or "reward_model" in names


class PromptSampler:
    """Deterministic prompts per step: a seeded permutation walked in step order (epochs reshuffle)."""

    def __init__(self, size: int, per_step: int, seed: int):
        if per_step > size:
            raise ConfigError(
                f"data.prompts_per_step={per_step} exceeds the {size} training prompts"
            )
        self.size, self.per_step, self.seed = size, per_step, seed

    def rows_for(self, step: int) -> list[int]:
        start = step * self.per_step
        out = []
        for j in range(start, start + self.per_step):
            epoch, pos = divmod(j, self.size)
            perm = np.random.default_rng((self.seed, epoch)).permutation(self.size)
            out.append(int(perm[pos]))
        return out
