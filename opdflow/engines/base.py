"""What every rollout engine offers the generator stage: load a version, sample a batch.

Engines return token ids and the log-probability of each sampled token under the
distribution actually sampled from (after temperature and top-p), so the rescorer can
measure the engine's mismatch on exactly the tokens it produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from opdflow.core.rollout import RolloutBatch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    return_logdist: bool = False
    """Also return the full next-token log-distribution (small vocabularies only)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One chunk of a step's prompts for one engine replica."""

    prompt_ids: list[list[int]]
    prompt_index: list[int]
    answers: list[str | None]
    n: int
    """Responses per prompt."""
    seed: int
    version: int
    params: SamplingParams = field(default_factory=SamplingParams)


def merge_requests(requests: list[GenerationRequest]) -> GenerationRequest:
    """One request holding all of `requests`' prompts, in order (the first one's seed): a
    replica then samples them in one engine call, one batch."""
    if len(requests) == 1:
        return requests[0]
    first = requests[0]
    for r in requests[1:]:
        if (r.n, r.version, r.params) != (first.n, first.version, first.params):
            raise ValueError("only requests of one step (same n, version, sampling) merge")
    return GenerationRequest(
        [p for r in requests for p in r.prompt_ids],
        [i for r in requests for i in r.prompt_index],
        [a for r in requests for a in r.answers],
        first.n,
        first.seed,
        first.version,
        first.params,
    )


class Engine(Protocol):
    version: int

    def load_weights(self, state: dict[str, Any], version: int) -> None: ...

    def generate(self, request: GenerationRequest) -> RolloutBatch: ...
