"""The study's plan: which arms it trains, at what scale and seeds, and which probes it runs.

A study is a list of arms (a rollout configuration, a staleness k, an objective), each
trained with the pipeline at one or more seeds, plus probes that need no training run.
`plan` says what runs; results.py turns the finished run directories into results and
verdicts, claims.py reads the paper's findings off them, doc.py writes docs/STUDY.md.
The seven experiments (docs/DESIGN.md, "The study"):

1. mismatch budget: the OPD ladder judged against the standard run; the bracket of D
2. staleness is cheap: d_stale at k = 1..8 next to the quantized engines' d_engine
3. OPD vs RL: REINFORCE and GRPO (0/1 correctness reward) on the same engines
4. score centering, for OPD and for RL
5. prefix shift vs per-token error (gradient_error.py), from a passing to a failing level
6. admission decisions, fixed before training, against the full-run verdicts
7. late training: error-to-update ratio at the untrained student vs the trained one

Pure code: nothing here imports Ray or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STANDARD = "bf16"
"""The standard engine; the standard run is bf16 at k = 0 with the OPD objective."""
ADMISSION_LINE = 0.0247
"""L for the admission decisions made before training: the line of a short calibration of
the study's models (k = 0, no importance weight) at the demo's lr 2e-4, 10-step runs:
`opdflow calibrate --short pipelines/tiny_cpu.py:synchronous --set train.is_clip=0
--sigmas 0.05,0.1,0.25,0.5` (Delta crosses tau between noise(0.25), D 0.023, +18%, and
noise(0.5), D 0.108, +65%). Fixed before the study's own runs, as the paper's pilot line."""


@dataclass(frozen=True)
class Arm:
    """One trained configuration of the study."""

    experiment: str
    """"ladder" (OPD, experiments 1, 2, 6), "rl" (3, 4), "centering" (4, OPD) or
    "staleness-lr" (2: staleness at another learning rate, judged against its own standard)."""
    recipe: str = STANDARD
    k: int = 0
    loss: str = "opd"
    center: bool = False
    seeds: tuple[int, ...] = (0,)
    lr_scale: float = 1.0
    """The scale's learning rate times this."""

    @property
    def name(self) -> str:
        parts = [self.loss + ("+center" if self.center else ""), self.recipe]
        if self.k:
            parts.append(f"k={self.k}")
        if self.lr_scale > 1.0:
            parts.append(f"lr x{self.lr_scale:g}")
        elif self.lr_scale < 1.0:
            parts.append(f"lr/{1 / self.lr_scale:g}")
        return " ".join(parts)

    @property
    def slug(self) -> str:
        keep = "".join(c if c.isalnum() or c in "=.-" else "_" for c in self.name)
        return keep.replace("__", "_").strip("_")

    @property
    def is_standard(self) -> bool:
        return (self.recipe, self.k, self.loss, self.center, self.lr_scale) == (
            STANDARD,
            0,
            "opd",
            False,
            1.0,
        )

    def overrides(self, scale: Scale, seed: int) -> list[str]:
        return [
            *scale.overrides(),
            f"engine.recipe={self.recipe}",
            "staleness.policy=fixed",
            f"staleness.k={self.k}",
            f"train.loss={self.loss}",
            f"train.center_advantage={str(self.center).lower()}",
            "train.is_clip=0",  # the paper's objective: no importance weight
            f"seed={seed}",
            *([f"train.lr={scale.lr * self.lr_scale:g}"] if self.lr_scale != 1.0 else []),
        ]


@dataclass(frozen=True)
class Scale:
    """How big each run is: the full study or the quick one CI runs."""

    name: str
    steps: int
    lr: float
    eval_prompts: int
    eval_samples: int
    probe_prompts: int
    probe_responses: int
    admission_prompts: int = 16
    admission_responses: int = 2

    def overrides(self) -> list[str]:
        return [
            f"name=study-{self.name}",
            f"train.steps={self.steps}",
            f"train.lr={self.lr}",
            f"eval.every={max(self.steps // 2, 1)}",
            f"eval.prompts={self.eval_prompts}",
            f"eval.samples_per_prompt={self.eval_samples}",
            f"reliability.checkpoint_every={self.steps}",
            "reliability.keep_checkpoints=1",
        ]


FULL = Scale(
    "full",
    steps=60,
    lr=2e-5,
    eval_prompts=128,
    eval_samples=4,
    probe_prompts=128,
    probe_responses=8,
)
QUICK = Scale(
    "quick", steps=24, lr=2e-4, eval_prompts=32, eval_samples=2, probe_prompts=64, probe_responses=8
)

NOISE = (0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 4.0)
"""Weight-noise ladder (sigma x std(W)), from about the quantized engines' D upwards."""
PROBE_PASS, PROBE_FAIL = "noise(0.1)", "noise(0.5)"
"""Experiment 5's passing and failing noise levels: either side of the ladder's bracket
(the quantized engines pass up to D ~ 0.007; noise(0.5) at D ~ 0.11 fails)."""


def plan(quick: bool) -> tuple[Scale, list[Arm]]:
    """The arms to train. Quick: the few arms whose claims hold at 24 steps."""
    if quick:
        return QUICK, [
            Arm("ladder", seeds=(0,)),
            Arm("ladder", "noise(4)"),
            Arm("ladder", k=8),
            Arm("rl", loss="grpo"),
            Arm("rl", "noise(4)", loss="grpo"),
        ]
    ladder = [
        Arm("ladder", seeds=(0, 1)),
        Arm("ladder", "fp8"),
        Arm("ladder", "fp8(bf16_layers=[0,-1])"),
        Arm("ladder", "fp8_kv"),
        Arm("ladder", "fp8_kv(kv_bf16_layers=[0])"),
        Arm("ladder", "nvfp4"),
        Arm("ladder", "nvfp4(bf16_layers=[0,-1])"),
        *(Arm("ladder", f"noise({s:g})") for s in NOISE),
        *(Arm("ladder", k=k) for k in (1, 2, 4, 8)),
        Arm("ladder", "fp8", k=4),
    ]
    rl = [
        Arm("rl", recipe, loss=loss, center=center)
        for loss in ("reinforce", "grpo")
        for center in (False, True)
        for recipe in (STANDARD, "noise(1)", "noise(2.5)", "noise(4)")
    ]
    # where RL starts to break: lower-mismatch engines, without centering
    rl += [
        Arm("rl", recipe, loss=loss)
        for loss in ("reinforce", "grpo")
        for recipe in ("nvfp4", "noise(0.1)", "noise(0.25)", "noise(0.5)")
    ]
    centering = [Arm("centering", r, center=True) for r in (STANDARD, "noise(2.5)", "noise(4)")]
    # what staleness costs is how far the student moves per step: the same k at ten times
    # the learning rate, against the standard at that rate
    slow = [Arm("staleness-lr", k=k, lr_scale=10.0) for k in (0, 4, 8)]
    return FULL, ladder + rl + centering + slow


def needs_repeat(verdict: dict[str, Any], tau: float) -> bool:
    """A verdict depends on noise when Delta is within a factor 2 of tau or its interval
    straddles zero while Delta >= tau: such arms get a second seed."""
    delta = verdict["delta"]
    return (tau / 2 <= delta < 2 * tau) or (delta >= tau and not verdict["fails"])
