"""The prompts a run trains and is judged on, and the synthetic task behind "tiny"."""

from __future__ import annotations

from dataclasses import dataclass, field

from opdflow.config.rules import in_range, one_of, positive


@dataclass
class TaskSpec:
    """The synthetic arithmetic task with checkable answers (used where data is "tiny")."""

    digits: int = 3
    """Digits per operand (zero-padded), e.g. 3 gives "Q:123+045="."""
    worked: bool = False
    """Responses write out every column (digits, carry in, two-digit sum) before the answer,
    about 30 tokens at 3 digits (engine.max_new_tokens >= 32); False: the bare answer."""
    num_train: int = 20000
    """Training prompts written to the cached parquet."""
    num_heldout: int = 256
    """Held-out prompts written to the cached parquet (disjoint from training)."""

    def validate(self, path: str) -> None:
        in_range(f"{path}.digits", self.digits, 1, 6)
        positive(f"{path}.num_train", self.num_train)
        positive(f"{path}.num_heldout", self.num_heldout)


@dataclass
class DataConfig:
    """Prompts for training and the held-out quality metric."""

    train: str = "tiny"
    """"tiny" or a parquet file: a `prompt` column (string or chat-message list)."""
    heldout: str = "tiny"
    """"tiny" or a parquet file with the same schema; fixed across runs for paired stats."""
    task: TaskSpec = field(default_factory=TaskSpec)
    """The synthetic task, used where train or heldout is "tiny"."""
    prompts_per_step: int = 8
    """Prompts per training step (the paper: 8)."""
    responses_per_prompt: int = 8
    """Responses sampled per prompt (the paper: 8)."""
    max_prompt_tokens: int = 512
    """Longer prompts are refused at load with the file and row named."""
    grader: str = "exact"
    """How a response's answer is checked against the reference, for held-out accuracy and
    the RL baselines' reward: "exact" (the tiny task: the text after the last ':' equals the
    answer) or "math" (math-verify: the response's \\boxed{} or last answer equals the
    ground truth as mathematics, so 1/2, 0.5 and \\frac{1}{2} agree; DAPO-Math-17k, AIME,
    MATH-500). With "math" every row of data.train and data.heldout needs a ground truth
    math-verify can parse, checked at start (the error names the file, row and column)."""
    grader_timeout_s: float = 5.0
    """Seconds the "math" grader may spend on one answer (parsing and comparison); an answer
    that takes longer counts as wrong."""

    def validate(self, path: str) -> None:
        self.task.validate(f"{path}.task")
        positive(f"{path}.prompts_per_step", self.prompts_per_step)
        positive(f"{path}.responses_per_prompt", self.responses_per_prompt)
        positive(f"{path}.max_prompt_tokens", self.max_prompt_tokens)
        one_of(f"{path}.grader", self.grader, ("exact", "math"))
        positive(f"{path}.grader_timeout_s", self.grader_timeout_s)
