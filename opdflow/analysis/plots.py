"""The report's figures: held-out curves, mismatch, trainer wait and the stage timeline.

Each function draws runs (analysis/runs.py) with matplotlib (Agg, imported when drawing)
and returns the PNG bytes; report.py writes them next to the page and embeds them in it.
"""

from __future__ import annotations

import io

from opdflow.analysis.curves import finite, heldout_curve, kl_curve, run_accuracy_curve
from opdflow.analysis.runs import Run

STAGE_COLORS = {
    "generator": "#1f77b4",
    "rescorer": "#ff7f0e",
    "teacher": "#2ca02c",
    "learner": "#d62728",
    "evaluator": "#9467bd",
    "publish": "#8c564b",
    "fetch": "#e377c2",
}


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.5, 3.6)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=size, dpi=100, squeeze=False)


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def plot_heldout(runs: list[Run], x: str) -> bytes:
    """Held-out KL against learner step (x="step") or wall seconds (x="time")."""
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        pts = kl_curve(r.metrics, r.heldout) if x == "time" else heldout_curve(r.heldout)
        if pts:
            a.plot(*zip(*pts), marker="o", label=r.label)
    a.set_xlabel("learner step (weight version)" if x == "step" else "wall time (s)")
    a.set_ylabel("held-out KL (nats/token)")
    a.set_title("Held-out KL(student || teacher) vs " + ("step" if x == "step" else "wall time"))
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_accuracy(runs: list[Run]) -> bytes:
    """Held-out accuracy (share of responses with the reference answer) against step."""
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        pts = run_accuracy_curve(r)
        if pts:
            a.plot(*zip(*pts), marker="o", label=r.label)
    a.set_xlabel("learner step (weight version)")
    a.set_ylabel("held-out accuracy")
    a.set_ylim(0, 1)
    a.set_title("Held-out accuracy (answer matches the reference) vs step")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_mismatch(runs: list[Run]) -> bytes:
    """d_engine and d_stale per step: k1 (solid) and k3 (dashed)."""
    fig, ax = _figure(1, 2, (10, 3.6))
    for col, part in enumerate(("d_engine", "d_stale")):
        a = ax[0][col]
        for i, r in enumerate(runs):
            color = f"C{i}"
            for est, style in (("k1", "-"), ("k3", "--")):
                pts = [
                    (m["step"], m[f"{part}_{est}"])
                    for m in r.metrics
                    if finite(m.get(f"{part}_{est}"))
                ]
                if pts:
                    a.plot(*zip(*pts), style, color=color, label=f"{r.name} {est}")
        a.axhline(0, color="grey", lw=0.6)
        a.set_title(f"{part} (nats/token) vs step")
        a.set_xlabel("learner step")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return _png(fig)


def plot_trainer_wait(runs: list[Run]) -> bytes:
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        pts = [
            (m["step"], m["trainer_wait_s"]) for m in r.metrics if finite(m.get("trainer_wait_s"))
        ]
        if pts:
            a.plot(*zip(*pts), marker=".", label=r.label)
    a.set_xlabel("learner step")
    a.set_ylabel("trainer wait (s)")
    a.set_title("Trainer wait before each step (waiting for a ready batch)")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_timeline(run: Run) -> bytes:
    """One lane per (stage, actor); a bar per span, coloured by stage."""
    spans = run.spans or []
    lanes = sorted(
        {(s["stage"], str(s["actor"])) for s in spans},
        key=lambda x: (list(STAGE_COLORS).index(x[0]) if x[0] in STAGE_COLORS else 99, x[1]),
    )
    fig, ax = _figure(size=(10, 0.45 * len(lanes) + 1.6))
    a = ax[0][0]
    for i, lane in enumerate(lanes):
        bars = [
            (s["start_s"], s["end_s"] - s["start_s"])
            for s in spans
            if (s["stage"], str(s["actor"])) == lane
        ]
        a.broken_barh(bars, (i - 0.4, 0.8), color=STAGE_COLORS.get(lane[0], "grey"))
    a.set_yticks(range(len(lanes)), [f"{st}:{ac}" for st, ac in lanes], fontsize=8)
    a.invert_yaxis()
    a.set_xlabel("wall time since run start (s)")
    a.set_title(f"Stage timeline: {run.name}")
    a.grid(axis="x", alpha=0.3)
    return _png(fig)
