"""docs/STUDY.md from a study's results.json: the claims first, then one section per experiment.

Every number on the page is computed from results.json (written by `opdflow study run`),
so rerunning the study and rendering again updates them all. The one hand-written part
is docs/study/discussion.md (why a tiny-model result differs from the paper's), appended
verbatim when present.
"""

from __future__ import annotations

import math
from pathlib import Path

from opdflow.study.plan import STANDARD
from opdflow.study.results import StudyResults, arm_verdict, group


def _f(x: float | None, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def _pct(x: float | None) -> str:
    return _f(x, "+.1%")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _interval(v: dict | None, key: str = "diff") -> str:
    if not v:
        return "-"
    d = v[key]
    return f"[{d['low']:+.3g}, {d['high']:+.3g}]"


def _plots(res: StudyResults, out: Path) -> list[str]:
    """Delta vs D for OPD and RL (log D); written as PNGs next to STUDY.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    names = []
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in res.runs:
        if r.verdict is None or r.loss != "opd" or r.experiment != "ladder" or not r.d > 0:
            continue
        ax.scatter(
            r.d,
            r.verdict["delta"],
            c="tab:red" if r.verdict["fails"] else "tab:green",
            marker="o" if r.k == 0 else "s",
            s=28,
        )
        ax.annotate(
            r.arm.replace("opd ", ""),
            (r.d, r.verdict["delta"]),
            fontsize=6,
            xytext=(3, 2),
            textcoords="offset points",
        )
    ax.axhline(res.tau, color="k", lw=0.8, ls="--", label=f"tau = {res.tau:g}")
    b = res.bracket
    if b.get("largest_pass") and b.get("smallest_fail"):
        ax.axvspan(b["largest_pass"], b["smallest_fail"], color="0.85", label="bracket")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.5)  # k = 8 diverges far above the rest
    ax.set_xlabel("D (nats/token, pooled over training)")
    ax.set_ylabel("Delta: final held-out KL vs standard")
    ax.set_title("OPD: quality vs mismatch (green pass, red fail; squares: k > 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "opd_delta_vs_d.png", dpi=120)
    plt.close(fig)
    names.append("opd_delta_vs_d.png")

    rl = [r for r in res.runs if r.loss != "opd" and r.verdict is not None and r.d > 0]
    if rl:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for loss, color in (("reinforce", "tab:blue"), ("grpo", "tab:orange")):
            for center, marker in ((False, "o"), (True, "^")):
                pts = sorted(
                    (r.d, r.verdict["acc_diff"]["estimate"])
                    for r in rl
                    if r.loss == loss and r.center == center
                )
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker=marker,
                        color=color,
                        label=f"{loss}{' + centering' if center else ''}",
                    )
        ax.axhline(-0.05, color="k", lw=0.8, ls="--", label="-5 points")
        ax.set_xscale("log")
        ax.set_xlabel("D (nats/token)")
        ax.set_ylabel("held-out accuracy vs its bf16 run")
        ax.set_title("RL baselines: accuracy change vs mismatch")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "rl_accuracy_vs_d.png", dpi=120)
        plt.close(fig)
        names.append("rl_accuracy_vs_d.png")
    return names


def render(res: StudyResults, docs: Path, source: str = "results.json") -> Path:
    """Write docs/STUDY.md (and docs/study/*.png); returns the page's path."""
    docs.mkdir(parents=True, exist_ok=True)
    plots = _plots(res, docs / "study")
    s = res.scale
    by = group(res.runs)
    total_s = sum(r.seconds for r in res.runs)
    L: list[str] = [
        "# The study on tiny models",
        "",
        "The findings of the paper (docs/DESIGN.md), re-run on opdflow's worked testbed "
        "(opdflow.testbed.tiny.worked: a 3-layer Qwen2 teacher that writes out every column of an "
        "addition, ~31 tokens, and a student fine-tuned from it to drop carries; the demo's "
        "models). Same shapes, not the same sizes: every number below comes from one run of",
        "",
        "```",
        f"opdflow study run{' --quick' if s['name'] == 'quick' else ''}   "
        f"# {len(res.runs)} training runs, {total_s / 60:.0f} min of training here",
        f"opdflow study render {source}",
        "```",
        "",
        f"Scale: **{s['name']}**: {s['steps']} learner steps per run at lr {s['lr']:g}, 8 prompts "
        f"x 8 responses per step, held-out KL on {s['eval_prompts']} prompts x "
        f"{s['eval_samples']} responses from the standard BF16 engine. The standard run is "
        f"bf16 at k = 0 with the OPD objective; quality rule tau = {res.tau:g} with a 95% "
        "paired bootstrap interval over prompts. Machine: "
        f"{res.machine.get('cpus', '?')} CPU cores, {res.machine.get('date', '?')}; "
        f"{res.machine.get('cores', '')}.",
        "",
        "## What holds here",
        "",
    ]
    mark = {True: "holds", False: "**does not hold**", None: "undecided"}
    L += _table(
        ["#", "finding", "paper", "here", "verdict"],
        [[str(c.number), c.finding, c.paper, c.found, mark[c.holds]] for c in res.claims],
    )

    # 1. ladder
    L += ["## 1. Mismatch budget (OPD ladder)", ""]
    rows = []
    for name, rs in by.items():
        if rs[0].experiment != "ladder":
            continue
        for r in rs:
            v = r.verdict
            rows.append(
                [
                    name,
                    str(r.seed),
                    _f(r.d),
                    _f(r.d_engine),
                    _f(r.d_stale),
                    _f(r.kl_final, ".4f"),
                    _pct(v["delta"]) if v else "(standard)",
                    _interval(v),
                    (v["decision"] if v else "-"),
                    arm_verdict(rs) if v else "-",
                ]
            )
    L += _table(
        [
            "configuration",
            "seed",
            "D",
            "d_engine",
            "d_stale",
            "final KL",
            "Delta",
            "95% CI of KL_c - KL_std",
            "verdict",
            "over seeds",
        ],
        rows,
    )
    b = res.bracket
    L += [f"Bracket: {b.get('message', '-')}", ""]
    L += [f"![OPD Delta vs D](study/{p})" for p in plots if p.startswith("opd")] + [""]

    # 2. staleness
    L += ["## 2. Staleness is cheap", ""]
    rows = []
    for rs in by.values():
        r = rs[0]
        if (r.experiment == "ladder" and (r.k or r.recipe != STANDARD)) or (
            r.experiment == "staleness-lr"
        ):
            deltas = [x.verdict["delta"] for x in rs if x.verdict]
            rows.append(
                [
                    r.arm,
                    str(r.k),
                    _f(r.lr, "g"),
                    _f(sum(x.d_engine for x in rs) / len(rs)),
                    _f(sum(x.d_stale for x in rs) / len(rs)),
                    ", ".join(_pct(d) for d in deltas) or "(standard)",
                    arm_verdict(rs),
                ]
            )
    L += _table(["configuration", "k", "lr", "d_engine", "d_stale", "Delta", "verdict"], rows)
    L += [
        "Runs at another learning rate are judged against the standard run at that rate.",
        "",
    ]

    # 3 & 4. RL and centering
    L += ["## 3-4. OPD vs RL, and score centering", ""]
    rows = []
    for rs in by.values():
        r = rs[0]
        if r.experiment not in ("rl", "centering"):
            continue
        for x in rs:
            v = x.verdict
            rows.append(
                [
                    x.arm,
                    _f(x.d),
                    _f(x.acc_final, ".1%"),
                    _f(v["acc_diff"]["estimate"], "+.1%") if v else "(base)",
                    _interval(v, "acc_diff") if v else "-",
                    _pct(v["delta"]) if v else "-",
                    _f(x.entropy, ".3f"),
                    _f(x.length, ".2f"),
                    _f(x.reward, ".1%"),
                    ("BREAKS" if x.breaks else "holds")
                    if x.breaks is not None
                    else (v["decision"] if v else "-"),
                ]
            )
    L += _table(
        [
            "run",
            "D",
            "held-out acc",
            "acc vs bf16",
            "95% CI",
            "Delta KL",
            "entropy",
            "length",
            "train reward",
            "verdict",
        ],
        rows,
    )
    L += [
        "An RL run breaks when it loses >= 5 accuracy points against the bf16 run of the same "
        "objective (interval below zero) or its entropy or response length falls below half "
        "of that run's. OPD rows here are judged by the quality rule against the standard run.",
        "",
    ]
    L += [f"![RL accuracy vs D](study/{p})" for p in plots if p.startswith("rl")] + [""]

    # 5 & 7. gradients
    L += ["## 5 and 7. Prefix shift vs per-token error; late training", ""]
    L += _table(
        [
            "engine",
            "student",
            "update |g|",
            "prefix shift",
            "per-token",
            "total",
            "noise floor",
            "total / update",
            "D (sample)",
        ],
        [
            [
                g["recipe"],
                g["student"],
                _f(g["update"]),
                _f(g["prefix_shift"]),
                _f(g["per_token"]),
                _f(g["total"]),
                _f(g["floor"]),
                _f(g["total_ratio"], ".2f"),
                _f(g["d_engine"]),
            ]
            for g in res.gradient
        ],
    )
    L += [
        "Prefix shift: tokens from the engine, advantage from the learner (opdflow's default "
        "objective). Per-token: the same tokens with the advantage taken from the engine's "
        "logprobs, minus the default. Noise floor: an independent BF16 sample against the "
        "reference: gradient differences at or below it are sampling noise.",
        "",
    ]

    # 6. admission
    L += ["## 6. Admission check against outcomes", ""]
    L += _table(
        ["engine", "D_hat (check)", "95% CI", "L", "decision", "with the study's L",
         "D in training", "full-run verdict", "check s", "run s"],
        [[a["recipe"], _f(a["d_hat"]), f"[{_f(a['ci_low'])}, {_f(a['ci_high'])}]",
          _f(a["line"]), a["decision"],
          f"{a.get('decision_hindsight', '-')} (L = {_f(a.get('line_hindsight'))})",
          _f(a.get("d_train")), a.get("outcome", "-"), _f(a["seconds"], ".2f"),
          _f(a.get("run_seconds"), ".0f")]
         for a in res.admission],
    )  # fmt: skip
    L += [
        "Decisions were made before any training run (ADMIT iff 1.5 x D_hat <= L), with the "
        "line L fixed beforehand (opdflow.study.plan.ADMISSION_LINE: a short calibration, "
        "`opdflow calibrate --short`, of these models against the study's standard run). "
        '"With the study\'s L" applies the '
        "line this study's own bracket gives, known only after training. The check sees the "
        "engine only: staleness arms are not in this table; bf16 is the standard run itself. "
        "Check seconds exclude loading the student once for all engines.",
        "",
    ]
    notes = docs / "study" / "discussion.md"
    if notes.is_file():  # written by people after reading the results above; kept verbatim
        L += ["## Discussion", "", notes.read_text().strip(), ""]
    path = docs / "STUDY.md"
    path.write_text("\n".join(L))
    return path
