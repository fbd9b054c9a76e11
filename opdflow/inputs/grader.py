"""Answer checking: is a response's answer the reference answer? (`data.grader`)

Two graders. "exact" is the tiny task's rule: the text after the response's last ":"
equals the reference string. "math" checks answers the way math datasets are written
(DAPO-Math-17k, AIME, MATH-500): the response's `\\boxed{}` answer (or its last plain
answer) against the ground truth, as mathematical objects, so `1/2`, `0.5` and
`\\frac{1}{2}` agree; it uses Hugging Face's math-verify library (sympy underneath).
Symbolic comparison can take unbounded time on adversarial input, so each answer is graded
under a timeout (`data.grader_timeout_s`); an answer that runs out of time counts as wrong.

The same grader gives held-out accuracy (the evaluator) and the RL baselines' 0/1 reward
(the generator). Ground truths are checked when prompt files load (data.py), so a file
whose reference cannot be parsed fails at start naming the row, not as silent zeros.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

GRADERS = ("exact", "math")
"""Values of data.grader."""


class GradingTimeout(BaseException):
    """Raised inside a grading call when its time is up. A BaseException, so math-verify's
    own `except Exception` handlers cannot swallow it and keep going."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise GradingTimeout in this thread after `seconds` (SIGALRM; main thread only, where
    Ray runs an actor's calls). Elsewhere, or with seconds <= 0, no limit."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise GradingTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class ExactGrader:
    """The tiny task's rule (task.is_correct): the text after the last ':' equals the answer."""

    kind = "exact"

    def __call__(self, response: str, answer: str | None) -> bool:
        from opdflow.testbed.task import is_correct

        return is_correct(response, answer)

    def check_ground_truth(self, answer: str | None) -> str | None:
        """Why `answer` cannot serve as a reference, or None when it can."""
        return "it is missing" if answer is None or not str(answer).strip() else None


class MathGrader:
    """math-verify: the response's boxed (or last) answer equals the ground truth as math."""

    kind = "math"

    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = timeout_s
        self.timeouts = 0
        """Answers that ran out of time (counted wrong)."""
        self._gold: dict[str, list] = {}
        # the timeout is ours (time_limit): math-verify's own would cancel it, so it is off
        # there, and its warning that it is off says nothing useful here
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)

    def _parse_gold(self, answer: str) -> list:
        from math_verify import parse

        text = str(answer).strip()
        if "\\boxed" not in text and "$" not in text:
            text = f"${text}$"  # a bare LaTeX expression: read it as math, not prose
        return parse(text, parsing_timeout=None)

    def gold(self, answer: str) -> list:
        """The parsed ground truth (cached: references repeat across samples and steps)."""
        if answer not in self._gold:
            self._gold[answer] = self._parse_gold(answer)
        return self._gold[answer]

    def check_ground_truth(self, answer: str | None) -> str | None:
        if answer is None or not str(answer).strip():
            return "it is missing"
        try:
            with time_limit(self.timeout_s):
                parsed = self.gold(str(answer))
        except GradingTimeout:
            return f"parsing it took more than data.grader_timeout_s={self.timeout_s:g} s"
        if not any(not isinstance(p, str) for p in parsed):
            return "math-verify cannot parse it as a mathematical answer"
        return None

    def __call__(self, response: str, answer: str | None) -> bool:
        if answer is None or not response.strip():
            return False
        from math_verify import parse, verify

        try:
            with time_limit(self.timeout_s):
                gold = self.gold(str(answer))
                pred = parse(response, parsing_timeout=None)
                return bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
        except GradingTimeout:
            self.timeouts += 1
            return False


def make_grader(kind: str = "exact", timeout_s: float = 5.0) -> ExactGrader | MathGrader:
    """The grader `data.grader` names (math-verify is imported at the first answer)."""
    if kind == "exact":
        return ExactGrader()
    if kind == "math":
        return MathGrader(timeout_s)
    from opdflow.errors import ConfigError

    raise ConfigError(f"data.grader = {kind!r} is not allowed: expected one of {GRADERS}")
