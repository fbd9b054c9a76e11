"""The quality rule: does a run with engine c end measurably worse than the standard run?

Delta(c) = (KL_c - KL_std) / KL_std on the final held-out KL of both runs, measured on
the same held-out prompts with the same sampling seed, so the two runs pair prompt by
prompt. A run FAILS when Delta(c) >= tau AND the 95% paired bootstrap interval of
KL_c - KL_std (resampling prompts) excludes zero (docs/DESIGN.md). Secondary rule, on the
task's checkable answers: accuracy is WORSE when the standard run's held-out accuracy
exceeds c's by at least `acc_drop` (default 5 points, the paper's failing runs lost 3-5)
AND the paired interval of acc_c - acc_std lies below zero. Pure code: run directories in,
a verdict out; nothing here imports Ray or torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opdflow.analysis.runs import Run, read_run
from opdflow.core.stats import Interval, paired_diff_ci
from opdflow.errors import ConfigError

TAU = 0.20
"""The paper's tolerance: a run fails at >= 20% worse final held-out KL."""
ACC_DROP = 0.05
"""Secondary rule: accuracy points lost that count as worse (when the interval agrees)."""

PAIRING_FIELDS = (
    ("data", "heldout"),
    ("data", "task"),
    ("eval", "prompts"),
    ("eval", "samples_per_prompt"),
    ("eval", "seed"),
    ("engine", "max_new_tokens"),
    ("models", "teacher"),
)
"""Config fields that must agree for two runs' held-out KL to pair prompt by prompt
(data.task only where data.heldout is "tiny": it defines the tiny held-out set)."""


def load_run(path: str | Path) -> Run:
    """The run in `path`, refused unless it holds what the rule reads (config and held-out)."""
    return read_run(
        path,
        ("config.json", "heldout.parquet"),
        "not a finished opdflow run directory "
        "(`opdflow run` writes config.json, metrics.parquet, heldout.parquet)",
    )


def pairing_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Human-readable 'field: a vs b' for every pairing field whose values differ."""
    out = []
    for section, key in PAIRING_FIELDS:
        if (section, key) == ("data", "task") and a.get("data", {}).get("heldout") != "tiny":
            continue
        va, vb = a.get(section, {}).get(key), b.get(section, {}).get(key)
        if va != vb:
            out.append(f"{section}.{key}: {va!r} vs {vb!r}")
    return out


def common_final_version(std: Run, c: Run, version: int | None = None) -> int:
    """The held-out version both runs are judged at: each run's final one, which must agree."""
    vs, vc = std.versions, c.versions
    common = sorted(set(vs) & set(vc))
    if version is not None:
        if version not in common:
            raise ConfigError(
                f"--version {version}: not evaluated in both runs (common versions: {common})"
            )
        return version
    if not vs or not vc or vs[-1] != vc[-1]:
        raise ConfigError(
            f"the runs lack a common final held-out version: {std.path} ends at "
            f"{vs[-1] if vs else 'none'}, {c.path} at {vc[-1] if vc else 'none'} "
            f"(common versions: {common}); train both for the same steps or pass --version"
        )
    return vs[-1]


@dataclass(frozen=True)
class Verdict:
    """One candidate run judged against the standard run."""

    std_run: str
    run: str
    recipe: str
    version: int
    prompts: int
    tau: float
    kl_std: float
    kl_c: float
    delta: float
    diff: Interval
    """KL_c - KL_std, nats/token, with its 95% paired bootstrap interval over prompts."""
    fails: bool
    acc_std: float
    acc_c: float
    acc_diff: Interval
    """acc_c - acc_std with its paired interval (share of responses correct)."""
    acc_drop: float
    acc_worse: bool

    @property
    def decision(self) -> str:
        return "FAIL" if self.fails else "PASS"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decision"] = self.decision
        d["accuracy_decision"] = "WORSE" if self.acc_worse else "OK"
        return d


def quality_fails(delta: float, diff: Interval, tau: float = TAU) -> bool:
    """The rule: fail iff Delta >= tau and the paired interval of the difference excludes 0."""
    return bool(delta >= tau and diff.excludes_zero())


def accuracy_worse(acc_diff: Interval, acc_drop: float = ACC_DROP) -> bool:
    """Secondary rule: lost >= acc_drop accuracy and the interval lies below zero."""
    return bool(-acc_diff.estimate >= acc_drop and acc_diff.high < 0)


def judge_rows(
    std_rows: list[dict[str, Any]],
    c_rows: list[dict[str, Any]],
    tau: float = TAU,
    acc_drop: float = ACC_DROP,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """The rule on two runs' per-prompt held-out rows (same prompt_index set required)."""
    ia = [int(r["prompt_index"]) for r in std_rows]
    ib = [int(r["prompt_index"]) for r in c_rows]
    if ia != ib:
        only = sorted(set(ia) ^ set(ib))[:5]
        raise ConfigError(
            f"held-out prompts differ: {len(ia)} vs {len(ib)} prompts "
            f"(prompt_index in one run only: {only}); the runs are not paired"
        )
    s_sum = [r["kl_sum"] for r in std_rows]
    s_tok = [r["tokens"] for r in std_rows]
    c_sum = [r["kl_sum"] for r in c_rows]
    c_tok = [r["tokens"] for r in c_rows]
    diff = paired_diff_ci(c_sum, c_tok, s_sum, s_tok, n_boot=n_boot, seed=seed)
    kl_std = sum(s_sum) / max(sum(s_tok), 1e-12)
    kl_c = sum(c_sum) / max(sum(c_tok), 1e-12)
    delta = (kl_c - kl_std) / kl_std if kl_std > 0 else math.inf
    ones = [1.0] * len(std_rows)
    acc_s = [float(r.get("accuracy", math.nan)) for r in std_rows]
    acc_c = [float(r.get("accuracy", math.nan)) for r in c_rows]
    acc_diff = paired_diff_ci(acc_c, ones, acc_s, ones, n_boot=n_boot, seed=seed)
    return {
        "prompts": len(ia),
        "kl_std": kl_std,
        "kl_c": kl_c,
        "delta": delta,
        "diff": diff,
        "fails": quality_fails(delta, diff, tau),
        "acc_std": sum(acc_s) / len(acc_s),
        "acc_c": sum(acc_c) / len(acc_c),
        "acc_diff": acc_diff,
        "acc_worse": accuracy_worse(acc_diff, acc_drop),
    }


def compare_runs(
    std: Run,
    c: Run,
    tau: float = TAU,
    acc_drop: float = ACC_DROP,
    version: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> Verdict:
    """Judge run c against the standard run; refuses runs that do not pair."""
    if not tau > 0:
        raise ConfigError(f"--tau {tau} is not allowed: expected a number > 0, e.g. 0.20")
    diffs = pairing_differences(std.config, c.config)
    if diffs:
        raise ConfigError(
            f"runs {std.path} and {c.path} are not paired on the same held-out prompts and "
            f"seeds: {'; '.join(diffs)}. Rerun one with the other's eval/data settings."
        )
    v = common_final_version(std, c, version)
    res = judge_rows(std.heldout_at(v), c.heldout_at(v), tau, acc_drop, n_boot, seed)
    return Verdict(
        std_run=str(std.path),
        run=str(c.path),
        recipe=c.recipe,
        version=v,
        tau=tau,
        acc_drop=acc_drop,
        **res,
    )
