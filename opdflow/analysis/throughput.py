"""Throughput curves: the table of a sweep over k, the knee of the curve, and its plot.

Asynchrony pays until the trainer becomes the bottleneck (docs/DESIGN.md, "The study"). A
sweep runs the same pipeline at several staleness bounds k (`opdflow sweep`; the report
finds one among any runs that differ in k) and tabulates, per run: updates/hour (and its
ratio to k = 0), the trainer's wait share, held-out KL at the start, the end and at equal
wall time, held-out accuracy, d_stale (each figure is figures.py's). The knee: the smallest fixed k whose updates/hour is at least 95% of
the best fixed k's; past it, more staleness buys less than 5% throughput. The numbers come
from each run's records (analysis/runs.py), so any finished run directory has a row;
matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from opdflow.analysis.curves import kl_at_time, kl_curve
from opdflow.analysis.figures import figures_of, label
from opdflow.analysis.runs import Run
from opdflow.core.policy import ADAPTIVE, k_label

KNEE_SHARE = 0.95
"""A k is on the flat part of the curve when it reaches this share of the best updates/hour."""


def knee(updates_per_hour: dict[int, float], share: float = KNEE_SHARE) -> int | None:
    """Smallest k whose updates/hour >= share * the best; None without finite values."""
    finite = {k: u for k, u in updates_per_hour.items() if math.isfinite(u)}
    if not finite:
        return None
    best = max(finite.values())
    return min(k for k, u in finite.items() if u >= share * best)


def is_sweep(runs: list[Run]) -> bool:
    """Several runs that differ in staleness (fixed k, or the adaptive policy)."""
    return len(runs) >= 2 and len({r.k_token for r in runs}) >= 2


def sweep_order(runs: list[Run]) -> list[Run]:
    """Fixed k ascending, then the adaptive runs."""
    return sorted(runs, key=lambda r: (r.k_token == ADAPTIVE, r.k if r.k is not None else -1))


def sweep_rows(runs: list[Run]) -> list[dict[str, Any]]:
    """One table row per run, in the given order (the sweep's, or `sweep_order`).

    Every figure is figures.py's, as the run's summary and the report show it: updates/hour
    and the trainer's wait share leave the warm-up steps out; d_stale is pooled over
    tokens; held-out KL at equal time is read at the shortest run's wall time.
    """
    nan = float("nan")
    figs = [figures_of(r) for r in runs]
    walls = [r.metrics[-1].get("time_s", nan) if r.metrics else nan for r in runs]
    t_equal = min(walls, default=nan)
    fixed = [(r, f) for r, f in zip(runs, figs) if r.k_token != ADAPTIVE]
    fixed_uph = {int(r.k or 0): f.updates_per_hour for r, f in fixed}
    base = fixed_uph.get(0, nan)
    k_knee = knee(fixed_uph)
    rows = []
    for r, f, wall in zip(runs, figs, walls):
        m, token = r.metrics, r.k_token
        rows.append(
            {
                "run": "?" if token is None else k_label(token),
                "policy": ADAPTIVE if token == ADAPTIVE else "fixed",
                "k": -1 if token == ADAPTIVE else r.k,
                "k_final": f.k_final,
                "k_mean": f.k_mean,
                "steps": f.steps,
                "updates_per_hour": f.updates_per_hour,
                "ratio_to_k0": f.updates_per_hour / base if base else nan,
                "trainer_wait_share": f.trainer_wait_share,
                "heldout_kl_start": f.heldout_kl_start,
                "heldout_kl_end": f.heldout_kl_end,
                "heldout_kl_equal_time": kl_at_time(kl_curve(m, r.heldout), t_equal),
                "equal_time_s": t_equal,
                "heldout_accuracy_start": f.heldout_accuracy_start,
                "heldout_accuracy_end": f.heldout_accuracy_end,
                "d_stale_k1": f.d_stale_k1,
                "max_staleness": f.max_staleness,
                "dropped_batches": int(m[-1].get("dropped", 0)) if m else 0,
                "wall_s": wall,
                "knee": token != ADAPTIVE and r.k == k_knee,
                "run_dir": str(r.path),
            }
        )
    return rows


def plot_sweep(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Four panels against k: updates/hour (ratio to k = 0 on the right axis), trainer wait
    share, held-out KL (end and at equal wall time), d_stale; the knee dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fixed = sorted((r for r in rows if r["policy"] != ADAPTIVE), key=lambda r: r["k"])
    adaptive = [r for r in rows if r["policy"] == ADAPTIVE]
    ks = [r["k"] for r in fixed]
    k_knee = next((r["k"] for r in fixed if r["knee"]), None)
    fig, ax = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)

    def panel(a, keys, ylabel, title):
        for key, name in keys:
            a.plot(ks, [r[key] for r in fixed], "o-", label=name)
            for r in adaptive:
                a.plot([r["k_mean"]], [r[key]], "*", ms=14, label=f"{name} (adaptive, mean k)")
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
    panel(
        ax[0, 1],
        [("trainer_wait_share", "wait share")],
        "share of step time",
        label("trainer_wait_share"),
    )
    ax[0, 1].yaxis.set_major_formatter(PercentFormatter(1.0))  # shares in percent, as printed
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
