"""The memory plan of a pipeline: every GPU actor's planned peak by part, against its GPU.

An actor's budget is its share of one GPU (resources.<stage>.num_gpus of the GPU's memory;
a tensor-parallel vLLM replica: one GPU per shard) less HEADROOM, kept free because the
caching allocator reserves more than it allocates. An actor fits when its peak (the sum
of its parts at the peak) is within that; a pipeline fits when every GPU actor does. A
refusal names the actor, the part that weighs most among those a field can shrink, and
the field. actors.py builds each stage's parts (`actors.plan_pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from opdflow.errors import ConfigError

GB = 1e9
HEADROOM = 0.05
"""Share of each GPU the plan keeps free: the caching allocator's fragmentation (what it
reserves runs above the allocated peak the plan counts)."""


@dataclass(frozen=True)
class Part:
    """One part of an actor's peak."""

    name: str
    bytes: float
    detail: str = ""
    """What it is, e.g. "AdamW moments, FP32, 1/2 of the model"."""
    field: str | None = None
    """The config field that shrinks it, its value and which way, e.g.
    "resources.learner.workers (now 2; more ranks hold smaller shards)"."""


@dataclass
class ActorPlan:
    """The plan of one actor (or of identical actors, e.g. every learner rank)."""

    actor: str
    """e.g. "learner[0-1]" (rank 0 holds the largest shards and publishes)."""
    share: float
    """GPUs of the actor's device this plan is for (0.5: half a GPU; 1 per TP shard)."""
    gpu: tuple[float, str] | None = None
    """(GB, what it is) of one GPU, None when unknown (the actor is not checked)."""
    parts: list[Part] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the peak does not show: the other activation-checkpointing setting, the logits
    chunk, the optimizer step, the KV cache's capacity."""
    problems: list[tuple[str, str]] = field(default_factory=list)
    """(what, field): failures whatever the GPU holds, e.g. a KV cache below one sequence."""

    @property
    def peak(self) -> float:
        return sum(p.bytes for p in self.parts)

    @property
    def budget(self) -> float | None:
        """Bytes the actor may use: its share of the GPU less HEADROOM."""
        return None if self.gpu is None else self.share * self.gpu[0] * GB * (1 - HEADROOM)

    @property
    def fits(self) -> bool:
        return not self.problems and (self.budget is None or self.peak <= self.budget)

    def refusal(self) -> str:
        """Why the actor does not fit: the actor, the part, the field to change."""
        if self.problems:
            what, fix = self.problems[0]
            return f"{self.actor}: {what}: change {fix}"
        assert self.gpu is not None
        assert self.budget is not None
        fixable = [p for p in self.parts if p.field]
        part = max(fixable or self.parts, key=lambda p: p.bytes)
        share = f"{self.share:g} of a " if self.share != 1 else ""
        return (
            f"{self.actor} needs {self.peak / GB:.1f} GB at its peak, more than its "
            f"{self.budget / GB:.1f} GB ({share}{self.gpu[0]:g} GB GPU less {HEADROOM:.0%} "
            f"kept free); its largest part is {part.name} ({part.bytes / GB:.1f} GB"
            + (f": {part.detail}" if part.detail else "")
            + ")"
            + (f"; change {part.field}" if part.field else "")
        )

    def lines(self) -> list[str]:
        """The actor's rows of the printed plan."""
        where = "GPU memory unknown (give --gpu-mem)"
        if self.gpu is not None:
            where = f"{self.share:g} GPU of {self.gpu[0]:g} GB, {self.gpu[1]}"
        verdict = "unchecked"
        if self.gpu is not None:
            used = self.peak / (self.share * self.gpu[0] * GB)
            verdict = f"{used:.0%} of it: " + ("fits" if self.fits else "DOES NOT FIT")
        out = [f"{self.actor}  ({where})  peak {self.peak / GB:.1f} GB, {verdict}"]
        for p in self.parts:
            detail = f"  {p.detail}" if p.detail else ""
            out.append(f"    {p.name:<28} {p.bytes / GB:7.2f} GB{detail}")
        out += [f"    . {n}" for n in self.notes]
        out += [f"    ! {what}: change {fix}" for what, fix in self.problems]
        return out


@dataclass
class MemoryPlan:
    """The plans of a pipeline's GPU actors."""

    actors: list[ActorPlan]
    sources: list[str] = field(default_factory=list)
    """Where the models' shapes came from, and what is assumed."""

    def lines(self) -> list[str]:
        head = [
            f"memory plan: peak device memory of each GPU actor by part (GB = 1e9 bytes); "
            f"an actor fits within its share of a GPU less {HEADROOM:.0%}"
        ]
        head += [f"  {s}" for s in self.sources]
        if not self.actors:
            return [*head, "  no actor has a GPU: nothing to plan"]
        return head + [line for a in self.actors for line in a.lines()]

    def check(self) -> None:
        """Raise a ConfigError naming every actor that does not fit."""
        bad = [a.refusal() for a in self.actors if not a.fits]
        if bad:
            raise ConfigError("the memory plan does not fit: " + "; ".join(bad))


GpuOf = Callable[[str], "tuple[float, str] | None"]
"""An actor's name -> (GB, what) of one GPU of its node, None when unknown."""


def uniform(gb: float, what: str = "--gpu-mem") -> GpuOf:
    """Every actor on a GPU of `gb` GB."""
    if not gb > 0:
        raise ConfigError(f"--gpu-mem {gb!r}: a GPU's memory in GB, e.g. 80 or 96")
    return lambda _actor: (gb, what)
