"""The report: one self-contained HTML page (and its PNG plots) that compares runs.

`write_report(paths, out)` reads run directories (or sweep directories holding several)
and writes held-out KL vs step and vs wall time, held-out accuracy vs step (when the
held-out prompts have reference answers), mismatch (d_engine, d_stale) vs step,
trainer wait vs step, the stage timeline (from spans.parquet when the profiler recorded
spans), the sweep table and curve when the runs differ in staleness (throughput.py), the
admission table when an admission.json is present, and a plain-language bottleneck line
per run (bottleneck.py). The page embeds every plot as base64 PNG, so it opens anywhere
without network. The numbers come from figures.py (the same the run summary and the sweep
table show, in the same units: shares in percent), curves.py and bottleneck.py, the plots
from plots.py; this module only lays them out.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from opdflow.analysis.bottleneck import IDLE_BOUND, WAIT_BOUND, bottleneck, run_shares
from opdflow.analysis.curves import run_accuracy_curve
from opdflow.analysis.figures import figures_of, label, show
from opdflow.analysis.plots import (
    plot_accuracy,
    plot_heldout,
    plot_mismatch,
    plot_timeline,
    plot_trainer_wait,
)
from opdflow.analysis.runs import Run, expand_run_dirs
from opdflow.analysis.throughput import is_sweep, plot_sweep, sweep_order, sweep_rows
from opdflow.errors import ConfigError


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


def _html_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A table whose headers are the figures' labels and whose cells are in their units."""
    head = "".join(f"<th>{html.escape(label(c))}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(show(c, r.get(c, '')))}</td>" for c in columns)
        + "</tr>"
        for r in rows
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
    runs = [Run(p) for p in run_dirs]
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
        fig = figures_of(r)
        rows.append(
            {
                "run": r.name,
                "recipe": r.recipe,
                "k": r.k,
                "steps": fig.steps,
                "heldout_kl_start": fig.heldout_kl_start,
                "heldout_kl_end": fig.heldout_kl_end,
                "heldout_accuracy_start": fig.heldout_accuracy_start,
                "heldout_accuracy_end": fig.heldout_accuracy_end,
                "updates_per_hour": fig.updates_per_hour,
                "trainer_wait_share": fig.trainer_wait_share,
                "generator_busy_share": run_shares(r).generator_busy,
            }
        )
    columns = list(rows[0])
    if not any(run_accuracy_curve(r) for r in runs):
        columns = [c for c in columns if not c.startswith("heldout_accuracy")]
    parts.append(_html_table(rows, columns))
    for r in runs:
        sh = run_shares(r)
        parts.append(
            f"<div class='verdict'>{html.escape(r.name)}: {html.escape(bottleneck(sh.trainer_wait, sh.generator_busy, r.k))}</div>"
        )
    parts.append(
        f"<p class='note'>Rule: generation-bound when the trainer waits for batches at least "
        f"{WAIT_BOUND:.0%} of its step time; else trainer-bound when generators are idle at least "
        f"{IDLE_BOUND:.0%} of the time; else balanced. Trainer wait share after warm-up; "
        "generator busy share from spans over the whole run when recorded, else from "
        "gen_s / step_s after warm-up.</p>"
    )

    parts.append("<h2>Held-out KL</h2>")
    parts.append(
        "<div class='row'>"
        + add("heldout_kl_vs_step", plot_heldout(runs, "step"), "held-out KL vs step")
        + add("heldout_kl_vs_time", plot_heldout(runs, "time"), "held-out KL vs wall time")
        + "</div>"
    )
    if any(run_accuracy_curve(r) for r in runs):
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
        srows = sweep_rows(sweep_order(runs))
        plot_sweep(srows, out_dir / "sweep.png")
        parts.append("<h2>Sweep over staleness k</h2>")
        parts.append(add("sweep", (out_dir / "sweep.png").read_bytes(), "sweep curve over k"))
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
