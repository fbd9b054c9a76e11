"""The report: PNG plots and one self-contained HTML page that compares runs.

`write_report(paths, out)` reads run directories (or sweep directories holding several)
and writes held-out KL vs step and vs wall time, held-out accuracy vs step (when the
held-out prompts have reference answers), mismatch (d_engine, d_stale) vs step,
trainer wait vs step, the stage timeline (from spans.parquet when the profiler recorded
spans), the sweep curve when the runs differ in staleness k, the admission table when an
admission.json is present, and a plain-language bottleneck line per run. The page embeds
every plot as base64 PNG, so it opens anywhere without network. The bottleneck rule and
the share computations are pure functions (unit-tested without plots or Ray).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opdflow.errors import ConfigError
from opdflow.runtime.profiler import union_seconds

WAIT_BOUND = 0.10
"""Trainer wait share (of learner step time) at or above which a run is generation-bound."""
IDLE_BOUND = 0.25
"""Generator idle share at or above which a run (not generation-bound) is trainer-bound."""

STAGE_COLORS = {
    "generator": "#1f77b4",
    "rescorer": "#ff7f0e",
    "teacher": "#2ca02c",
    "learner": "#d62728",
    "evaluator": "#9467bd",
    "publish": "#8c564b",
    "fetch": "#e377c2",
}


# ---------------------------------------------------------------- loading


@dataclass
class RunData:
    """What the report reads from one run directory."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    heldout: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] | None = None
    summary: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def k(self) -> int | None:
        return self.config.get("staleness", {}).get("k")

    @property
    def label(self) -> str:
        recipe = self.config.get("engine", {}).get("recipe", "?")
        return f"{self.name} (k={self.k}, {recipe})"


def _table(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def is_run_dir(path: Path) -> bool:
    return (path / "metrics.parquet").is_file()


def expand_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run directories named directly, or found one level below a sweep directory."""
    found: list[Path] = []
    for p in map(Path, paths):
        if is_run_dir(p):
            found.append(p)
        elif p.is_dir() and (subs := sorted(d for d in p.iterdir() if is_run_dir(d))):
            found.extend(subs)
        else:
            raise ConfigError(
                f"{p} is neither a run directory (no metrics.parquet) nor a sweep directory "
                "holding run directories; give the directory `opdflow run` wrote"
            )
    return list(dict.fromkeys(found))


def load_run(path: Path) -> RunData:
    """Read one run directory; spans, held-out and summary are optional."""

    def opt_json(name: str) -> Any:
        f = path / name
        return json.loads(f.read_text()) if f.is_file() else None

    return RunData(
        path=path,
        config=opt_json("config.json") or {},
        metrics=_table(path / "metrics.parquet"),
        heldout=_table(path / "heldout.parquet") if (path / "heldout.parquet").is_file() else [],
        spans=_table(path / "spans.parquet") if (path / "spans.parquet").is_file() else None,
        summary=opt_json("summary.json"),
    )


def load_admission(dirs: list[Path]) -> list[dict[str, Any]] | None:
    """Rows of the first admission.json found in the given directories, or None."""
    for d in dirs:
        f = d / "admission.json"
        if f.is_file():
            rows = json.loads(f.read_text())
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ConfigError(f"{f}: expected a JSON list of row objects")
            return rows
    return None


# ---------------------------------------------------------------- pure numbers


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def heldout_curve(heldout: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(version, token-pooled held-out KL) per evaluated version, in version order."""
    by_v: dict[int, list[float]] = {}
    for r in heldout:
        acc = by_v.setdefault(int(r["version"]), [0.0, 0.0])
        acc[0] += r["kl_sum"]
        acc[1] += r["tokens"]
    return [(v, s / max(t, 1.0)) for v, (s, t) in sorted(by_v.items())]


def accuracy_curve(run: RunData) -> list[tuple[int, float]]:
    """(version, held-out accuracy) per evaluated version; empty when the run's held-out
    prompts have no reference answers (its accuracy would be a meaningless 0)."""
    from opdflow.testbed.data import heldout_has_answers

    answers = heldout_has_answers(run.config.get("data", {}).get("heldout", "tiny"))
    acc = [r.get("accuracy") for r in run.heldout]
    if answers is False or not acc or any(not _finite(a) for a in acc):
        return []
    if answers is None and not any(acc):  # the prompt file is not here: all-zero is no signal
        return []
    by_v: dict[int, list[float]] = {}
    for r in run.heldout:
        by_v.setdefault(int(r["version"]), []).append(float(r["accuracy"]))
    return [(v, sum(a) / len(a)) for v, a in sorted(by_v.items())]


def version_times(metrics: list[dict[str, Any]]) -> dict[int, float]:
    """Wall seconds since the run's start at which each weight version existed.

    Step n's row ends when version n + 1 is published; version 0 exists at time 0.
    """
    return {0: 0.0, **{int(r["step"]) + 1: float(r["time_s"]) for r in metrics}}


def busy_shares(spans: list[dict[str, Any]]) -> dict[str, float]:
    """Per stage: the share of the spans' wall window its actors were busy, averaged over actors."""
    if not spans:
        return {}
    t0 = min(s["start_s"] for s in spans)
    t1 = max(s["end_s"] for s in spans)
    window = max(t1 - t0, 1e-9)
    per_actor: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in spans:
        per_actor.setdefault((s["stage"], str(s["actor"])), []).append((s["start_s"], s["end_s"]))
    by_stage: dict[str, list[float]] = {}
    for (stage, _), iv in per_actor.items():
        by_stage.setdefault(stage, []).append(union_seconds(iv) / window)
    return {stage: sum(v) / len(v) for stage, v in by_stage.items()}


@dataclass
class Shares:
    """The two numbers the bottleneck rule reads, and where the generator's came from."""

    trainer_wait: float
    generator_busy: float
    source: str


def run_shares(run: RunData) -> Shares:
    """Trainer wait share from metrics; generator busy share from spans, else from gen_s.

    Warm-up steps (config warmup_steps; actor start, first weight fetch) are left out when
    later steps exist.
    """
    warm = int(run.config.get("warmup_steps", 0) or 0)
    rows = run.metrics[warm:] if len(run.metrics) > warm else run.metrics
    step_s = sum(r["step_s"] for r in rows if _finite(r.get("step_s")))
    wait_s = sum(r["trainer_wait_s"] for r in rows if _finite(r.get("trainer_wait_s")))
    wait = wait_s / step_s if step_s > 0 else float("nan")
    if run.spans:
        gen = busy_shares(run.spans).get("generator", float("nan"))
        return Shares(wait, gen, "spans")
    gen_s = sum(r["gen_s"] for r in rows if _finite(r.get("gen_s")))
    gen = min(gen_s / step_s, 1.0) if step_s > 0 else float("nan")
    return Shares(wait, gen, "metrics gen_s / step_s")


def bottleneck(
    trainer_wait_share: float,
    generator_busy_share: float,
    k: int | None = None,
    wait_bound: float = WAIT_BOUND,
    idle_bound: float = IDLE_BOUND,
) -> str:
    """One plain-language line saying which stage limits throughput.

    Rule: the trainer waiting for batches at least `wait_bound` of its step time means
    generation is the bottleneck (raise k or add rollout workers); otherwise generators
    idle at least `idle_bound` of the time means the learner is (more rollout workers will
    not help); otherwise the run is balanced.
    """
    if not (_finite(trainer_wait_share) and _finite(generator_busy_share)):
        return "unknown: not enough timing data to name a bottleneck"
    idle = max(0.0, 1.0 - generator_busy_share)
    if trainer_wait_share >= wait_bound:
        now = f" (now k={k})" if k is not None else ""
        return (
            f"generation-bound: the trainer waits {trainer_wait_share:.0%} of its step time; "
            f"raise k{now} or add rollout workers"
        )
    if idle >= idle_bound:
        return (
            f"trainer-bound: generation idle {idle:.0%}; more rollout workers will not help "
            "(a faster learner will)"
        )
    return (
        f"balanced: the trainer waits {trainer_wait_share:.0%} of its step time and "
        f"generation is idle {idle:.0%}"
    )


def is_sweep(runs: list[RunData]) -> bool:
    """Several runs that differ in staleness k."""
    return len(runs) >= 2 and len({r.k for r in runs}) >= 2


def sweep_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per k (sorted): updates/hour, ratio to the smallest k, trainer wait share, end KL, d_stale."""
    rows = []
    for r in sorted(runs, key=lambda r: (r.k is None, r.k)):
        m = r.metrics
        uph = m[-1].get("updates_per_hour", float("nan")) if m else float("nan")
        curve = heldout_curve(r.heldout)
        stale = [x["d_stale_k1"] for x in m if _finite(x.get("d_stale_k1"))]
        rows.append(
            {
                "run": r.name,
                "k": r.k,
                "updates_per_hour": uph,
                "trainer_wait_share": run_shares(r).trainer_wait,
                "heldout_kl_end": curve[-1][1] if curve else float("nan"),
                "d_stale_k1": sum(stale) / len(stale) if stale else float("nan"),
            }
        )
    base = rows[0]["updates_per_hour"] if rows else float("nan")
    for row in rows:
        ok = _finite(base) and base > 0 and _finite(row["updates_per_hour"])
        row["ratio_to_first_k"] = row["updates_per_hour"] / base if ok else float("nan")
    return rows


# ---------------------------------------------------------------- plots


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


def plot_heldout(runs: list[RunData], x: str) -> bytes:
    """Held-out KL against learner step (x="step") or wall seconds (x="time")."""
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        curve = heldout_curve(r.heldout)
        if x == "time":
            times = version_times(r.metrics)
            pts = [(times[v], kl) for v, kl in curve if v in times]
        else:
            pts = curve
        if pts:
            a.plot(*zip(*pts), marker="o", label=r.label)
    a.set_xlabel("learner step (weight version)" if x == "step" else "wall time (s)")
    a.set_ylabel("held-out KL (nats/token)")
    a.set_title("Held-out KL(student || teacher) vs " + ("step" if x == "step" else "wall time"))
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_accuracy(runs: list[RunData]) -> bytes:
    """Held-out accuracy (share of responses with the reference answer) against step."""
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        pts = accuracy_curve(r)
        if pts:
            a.plot(*zip(*pts), marker="o", label=r.label)
    a.set_xlabel("learner step (weight version)")
    a.set_ylabel("held-out accuracy")
    a.set_ylim(0, 1)
    a.set_title("Held-out accuracy (answer matches the reference) vs step")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_mismatch(runs: list[RunData]) -> bytes:
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
                    if _finite(m.get(f"{part}_{est}"))
                ]
                if pts:
                    a.plot(*zip(*pts), style, color=color, label=f"{r.name} {est}")
        a.axhline(0, color="grey", lw=0.6)
        a.set_title(f"{part} (nats/token) vs step")
        a.set_xlabel("learner step")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return _png(fig)


def plot_trainer_wait(runs: list[RunData]) -> bytes:
    fig, ax = _figure()
    a = ax[0][0]
    for r in runs:
        pts = [
            (m["step"], m["trainer_wait_s"]) for m in r.metrics if _finite(m.get("trainer_wait_s"))
        ]
        if pts:
            a.plot(*zip(*pts), marker=".", label=r.label)
    a.set_xlabel("learner step")
    a.set_ylabel("trainer wait (s)")
    a.set_title("Trainer wait before each step (waiting for a ready batch)")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    return _png(fig)


def plot_timeline(run: RunData) -> bytes:
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


def plot_sweep(rows: list[dict[str, Any]]) -> bytes:
    """Updates/hour (and ratio to the first k), trainer wait share and end held-out KL vs k."""
    fig, ax = _figure(1, 3, (12, 3.6))
    ks = [r["k"] for r in rows]
    a = ax[0][0]
    a.plot(ks, [r["updates_per_hour"] for r in rows], marker="o")
    for r in rows:
        if _finite(r["ratio_to_first_k"]):
            a.annotate(
                f"{r['ratio_to_first_k']:.2f}x",
                (r["k"], r["updates_per_hour"]),
                fontsize=8,
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
            )
    a.margins(y=0.2)
    a.set_title("updates/hour vs k (ratio to first k)")
    a.set_xlabel("staleness k")
    ax[0][1].plot(ks, [r["trainer_wait_share"] for r in rows], marker="o", color="C3")
    ax[0][1].set_title("trainer wait share vs k")
    ax[0][1].set_xlabel("staleness k")
    ax[0][2].plot(ks, [r["heldout_kl_end"] for r in rows], marker="o", color="C2")
    ax[0][2].set_title("held-out KL at the end vs k")
    ax[0][2].set_xlabel("staleness k")
    for a in ax[0]:
        a.grid(alpha=0.3)
    return _png(fig)


# ---------------------------------------------------------------- page


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:24px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
.row{display:flex;gap:8px} .row img{max-width:49.5%}
.verdict{font-weight:600;padding:6px 10px;background:#fff7e0;border-left:4px solid #e0a800;margin:4px 0}
.note{color:#666;font-size:13px}
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return f"{v:.4g}"
    return html.escape(str(v))


def _html_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _img(png: bytes, name: str, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img class="plot" id="{name}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_report(paths: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the PNG plots and report.html for the runs under `paths`; returns the page's path."""
    given = [Path(p) for p in paths]
    run_dirs = expand_run_dirs(given)
    runs = [load_run(p) for p in run_dirs]
    out_dir = (
        Path(out)
        if out is not None
        else (given[0] / "report" if len(given) == 1 else Path("opdflow-report"))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, tuple[bytes, str]] = {}

    def add(name: str, png: bytes, alt: str) -> str:
        (out_dir / f"{name}.png").write_bytes(png)
        pngs[name] = (png, alt)
        return _img(png, name, alt)

    parts = [
        f"<h1>opdflow report</h1><p class='note'>{len(runs)} run(s): "
        + ", ".join(html.escape(str(p)) for p in run_dirs)
        + "</p>"
    ]

    parts.append("<h2>Runs and bottleneck</h2>")
    rows = []
    for r in runs:
        sh = run_shares(r)
        curve = heldout_curve(r.heldout)
        acc = accuracy_curve(r)
        rows.append(
            {
                "run": r.name,
                "recipe": r.config.get("engine", {}).get("recipe", "?"),
                "k": r.k,
                "steps": len(r.metrics),
                "held-out KL start": curve[0][1] if curve else float("nan"),
                "held-out KL end": curve[-1][1] if curve else float("nan"),
                "held-out accuracy start": acc[0][1] if acc else float("nan"),
                "held-out accuracy end": acc[-1][1] if acc else float("nan"),
                "updates/hour": r.metrics[-1].get("updates_per_hour", float("nan"))
                if r.metrics
                else float("nan"),
                "trainer wait share": sh.trainer_wait,
                "generator busy share": sh.generator_busy,
            }
        )
    columns = list(rows[0])
    if not any(accuracy_curve(r) for r in runs):
        columns = [c for c in columns if not c.startswith("held-out accuracy")]
    parts.append(_html_table(rows, columns))
    for r in runs:
        sh = run_shares(r)
        parts.append(
            f"<div class='verdict'>{html.escape(r.name)}: {html.escape(bottleneck(sh.trainer_wait, sh.generator_busy, r.k))}</div>"
        )
    parts.append(
        f"<p class='note'>Rule: generation-bound when the trainer waits for batches at least "
        f"{WAIT_BOUND:.0%} of its step time; else trainer-bound when generators are idle at least "
        f"{IDLE_BOUND:.0%} of the time; else balanced. Warm-up steps excluded; generator busy share "
        "from spans when recorded, else from gen_s / step_s.</p>"
    )

    parts.append("<h2>Held-out KL</h2>")
    parts.append(
        "<div class='row'>"
        + add("heldout_kl_vs_step", plot_heldout(runs, "step"), "held-out KL vs step")
        + add("heldout_kl_vs_time", plot_heldout(runs, "time"), "held-out KL vs wall time")
        + "</div>"
    )
    if any(accuracy_curve(r) for r in runs):
        parts.append("<h2>Held-out accuracy</h2>")
        parts.append(
            add("heldout_accuracy_vs_step", plot_accuracy(runs), "held-out accuracy vs step")
        )
    parts.append("<h2>Mismatch</h2>")
    parts.append(add("mismatch", plot_mismatch(runs), "d_engine and d_stale vs step"))
    parts.append("<h2>Trainer wait</h2>")
    parts.append(add("trainer_wait", plot_trainer_wait(runs), "trainer wait vs step"))

    parts.append("<h2>Stage timeline</h2>")
    for r in runs:
        if r.spans:
            parts.append(
                add(f"timeline_{_slug(r.name)}", plot_timeline(r), f"stage timeline of {r.name}")
            )
        else:
            parts.append(f"<p class='note'>{html.escape(r.name)}: no spans recorded</p>")

    if is_sweep(runs):
        srows = sweep_rows(runs)
        parts.append("<h2>Sweep over staleness k</h2>")
        parts.append(add("sweep", plot_sweep(srows), "sweep curve over k"))
        parts.append(_html_table(srows, list(srows[0])))

    admission = load_admission([*given, *run_dirs])
    if admission:
        cols = ["recipe", "d_hat", "ci_low", "ci_high", "decision", "seconds"]
        cols += [c for c in admission[0] if c not in cols]
        parts.append("<h2>Admission</h2>")
        parts.append(_html_table(admission, cols))

    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>opdflow report</title>"
        f"<style>{_CSS}</style></head><body>" + "\n".join(parts) + "</body></html>"
    )
    path = out_dir / "report.html"
    path.write_text(page)
    return path
