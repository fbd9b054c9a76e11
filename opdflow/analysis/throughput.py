"""Throughput curves: what a sweep over k measured, the knee of the curve, and its plot.

Asynchrony pays until the trainer becomes the bottleneck (docs/DESIGN.md, "The study"). A sweep runs
the same pipeline at several staleness bounds k and tabulates updates/hour (and its ratio
to k = 0), the trainer's wait share, held-out KL at the end and at equal wall time, and
d_stale. The knee: the smallest fixed k whose updates/hour is at least 95% of the best
fixed k's; past it, more staleness buys less than 5% throughput. Pure functions over run
records (metrics and held-out rows); matplotlib is imported only to draw.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

KNEE_SHARE = 0.95
"""A k is on the flat part of the curve when it reaches this share of the best updates/hour."""


def knee(updates_per_hour: dict[int, float], share: float = KNEE_SHARE) -> int | None:
    """Smallest k whose updates/hour >= share * the best; None without finite values."""
    finite = {k: u for k, u in updates_per_hour.items() if math.isfinite(u)}
    if not finite:
        return None
    best = max(finite.values())
    return min(k for k, u in finite.items() if u >= share * best)


def kl_curve(metrics: list[dict], heldout: list[dict]) -> list[tuple[float, float]]:
    """(wall seconds, pooled held-out KL) per evaluated version; version v exists from the
    end of step v - 1 (version 0 at time 0)."""
    end_of_step = {r["step"]: r["time_s"] for r in metrics}
    pooled: dict[int, list[float]] = {}
    for r in heldout:
        acc = pooled.setdefault(r["version"], [0.0, 0.0])
        acc[0] += r["kl_sum"]
        acc[1] += r["tokens"]
    out = []
    for v in sorted(pooled):
        t = 0.0 if v == 0 else end_of_step.get(v - 1)
        if t is not None:
            out.append((t, pooled[v][0] / max(pooled[v][1], 1.0)))
    return out


def kl_at_time(curve: list[tuple[float, float]], t: float) -> float:
    """Held-out KL at wall time t, linear between evaluations (nan outside them)."""
    if not curve or t < curve[0][0] or t > curve[-1][0]:
        return float("nan")
    for (t0, y0), (t1, y1) in itertools.pairwise(curve):
        if t0 <= t <= t1:
            return y0 if t1 == t0 else y0 + (y1 - y0) * (t - t0) / (t1 - t0)
    return curve[-1][1]


def sweep_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per run. Each run: label, policy, summary, metrics, heldout."""
    curves = [kl_curve(r["metrics"], r["heldout"]) for r in runs]
    walls = [r["metrics"][-1]["time_s"] for r in runs]
    t_equal = min(walls)
    fixed_uph = {
        r["summary_k"]: r["summary"]["updates_per_hour"] for r in runs if r["policy"] == "fixed"
    }
    base = fixed_uph.get(0, float("nan"))
    k_knee = knee(fixed_uph)
    rows = []
    for r, curve, wall in zip(runs, curves, walls):
        s, m = r["summary"], r["metrics"]
        ks = [row["k"] for row in m]
        rows.append(
            {
                "run": r["label"],
                "policy": r["policy"],
                "k": r["summary_k"],
                "k_final": ks[-1],
                "k_mean": sum(ks) / len(ks),
                "steps": s["steps"],
                "updates_per_hour": s["updates_per_hour"],
                "ratio_to_k0": s["updates_per_hour"] / base if base else float("nan"),
                "trainer_wait_share": s["trainer_wait_share"],
                "heldout_kl_start": s["heldout_kl_start"],
                "heldout_kl_end": s["heldout_kl_end"],
                "heldout_kl_equal_time": kl_at_time(curve, t_equal),
                "equal_time_s": t_equal,
                "d_stale_k1": s["d_stale_k1"],
                "max_staleness": s["max_staleness"],
                "dropped_batches": s["dropped_batches"],
                "wall_s": wall,
                "knee": r["policy"] == "fixed" and r["summary_k"] == k_knee,
                "run_dir": s["run_dir"],
            }
        )
    return rows


def plot_sweep(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Four panels against k: updates/hour (ratio to k = 0 on the right axis), trainer wait
    share, held-out KL (end and at equal wall time), d_stale; the knee dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = sorted((r for r in rows if r["policy"] == "fixed"), key=lambda r: r["k"])
    adaptive = [r for r in rows if r["policy"] == "adaptive"]
    ks = [r["k"] for r in fixed]
    k_knee = next((r["k"] for r in fixed if r["knee"]), None)
    fig, ax = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)

    def panel(a, keys, ylabel, title):
        for key, label in keys:
            a.plot(ks, [r[key] for r in fixed], "o-", label=label)
            for r in adaptive:
                a.plot([r["k_mean"]], [r[key]], "*", ms=14, label=f"{label} (adaptive, mean k)")
        if k_knee is not None:
            a.axvline(k_knee, ls="--", c="gray", lw=1)
        a.set_xlabel("staleness bound k")
        a.set_ylabel(ylabel)
        a.set_title(title)
        a.grid(alpha=0.3)

    panel(ax[0, 0], [("updates_per_hour", "updates/hour")], "updates/hour", "Throughput")
    base = next((r["updates_per_hour"] for r in fixed if r["k"] == 0), None)
    if base:
        right = ax[0, 0].twinx()
        lo, hi = ax[0, 0].get_ylim()
        right.set_ylim(lo / base, hi / base)
        right.set_ylabel("ratio to k = 0")
    if k_knee is not None:
        ax[0, 0].annotate(
            f"knee k={k_knee}\n(>= {KNEE_SHARE:.0%} of best)",
            (k_knee, ax[0, 0].get_ylim()[0]),
            xytext=(5, 10),
            textcoords="offset points",
            fontsize=8,
        )
    panel(ax[0, 1], [("trainer_wait_share", "wait share")], "share of step time", "Trainer wait")
    panel(
        ax[1, 0],
        [("heldout_kl_end", "at the end"), ("heldout_kl_equal_time", "at equal wall time")],
        "nats/token",
        "Held-out KL",
    )
    ax[1, 0].legend(fontsize=7)
    panel(ax[1, 1], [("d_stale_k1", "d_stale")], "nats/token", "Staleness mismatch")
    fig.savefig(path, dpi=120)
    plt.close(fig)
