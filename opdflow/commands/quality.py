"""`opdflow compare` and `opdflow admit`: the quality rule and the admission check on the
command line (logic in analysis/quality.py and analysis/admission.py; calibrate.py derives
the budget line admit reads)."""

from __future__ import annotations

import json
import sys

import click

from opdflow.commands.options import (
    json_option,
    pipeline_argument,
    seed_option,
    set_option,
    tau_option,
)


def _console(err: bool = False):
    from rich.console import Console

    return Console(stderr=err)


# ---------------------------------------------------------------- compare


def _print_verdict(v) -> None:
    from rich.table import Table

    t = Table(title=f"quality rule: {v.run} vs standard {v.std_run}", show_header=False)
    t.add_row("recipe", v.recipe)
    t.add_row("held-out version / prompts", f"{v.version} / {v.prompts} (paired by prompt)")
    t.add_row("final held-out KL std -> c", f"{v.kl_std:.5f} -> {v.kl_c:.5f} nats/token")
    t.add_row(
        "KL_c - KL_std (95% paired CI)",
        f"{v.diff.estimate:+.5f}  [{v.diff.low:+.5f}, {v.diff.high:+.5f}]"
        f"  {'excludes 0' if v.diff.excludes_zero() else 'includes 0'}",
    )
    t.add_row("Delta(c)", f"{v.delta:+.1%}  (tau = {v.tau:.0%})")
    color = "red" if v.fails else "green"
    t.add_row(
        "decision", f"[bold {color}]{v.decision}[/]  (FAIL iff Delta >= tau AND CI excludes 0)"
    )
    t.add_row(
        "accuracy std -> c (95% CI of diff)",
        f"{v.acc_std:.1%} -> {v.acc_c:.1%}  [{v.acc_diff.low:+.1%}, {v.acc_diff.high:+.1%}]",
    )
    t.add_row(
        "accuracy rule",
        f"{'WORSE' if v.acc_worse else 'OK'}  (WORSE iff >= {v.acc_drop:.0%} points lost AND CI < 0)",
    )
    _console().print(t)


@click.command()
@click.argument("run_std", type=click.Path())
@click.argument("run_c", type=click.Path())
@tau_option
@click.option(
    "--acc-drop", type=float, default=0.05, show_default=True, help="Accuracy points that count."
)
@click.option("--version", type=int, default=None, help="Held-out version (default: the final).")
@json_option("the verdict")
def compare(
    run_std: str, run_c: str, tau: float, acc_drop: float, version: int | None, as_json: bool
) -> None:
    """Judge RUN_C against the standard run RUN_STD on the same held-out prompts.

    Exit code 0 on PASS, 1 on FAIL, 2 when the runs cannot be compared.
    """
    from opdflow.analysis.quality import compare_runs, load_run

    v = compare_runs(
        load_run(run_std), load_run(run_c), tau=tau, acc_drop=acc_drop, version=version
    )
    if as_json:
        click.echo(json.dumps(v.to_dict(), indent=2))
    else:
        _print_verdict(v)
    sys.exit(1 if v.fails else 0)


# ---------------------------------------------------------------- admit


def _canonical(recipe: str) -> str:
    from opdflow.core.recipe import parse_recipe

    return parse_recipe(recipe).text


def _admit_table(decisions, budget, alpha: float, cfg, speed_source: str) -> None:
    from rich.table import Table

    from opdflow.core.duration import duration

    t = Table(title=f"admission check: {cfg.name} (L = {budget.line:.4g}, alpha = {alpha:g})")
    for col in ("recipe", "D_hat nats/tok", "95% CI", "alpha*D_hat", "decision", "tokens"):
        t.add_column(col, justify="left" if col == "recipe" else "right")
    t.add_column("check took", justify="right")
    t.add_column("full run (est.)", justify="right")
    for d in decisions:
        color = "green" if d.admit else "red"
        t.add_row(
            d.recipe,
            f"{d.d_hat:.4g}",
            f"[{d.ci_low:.4g}, {d.ci_high:.4g}]",
            f"{d.alpha * d.d_hat:.4g}",
            f"[bold {color}]{d.decision}[/]" + (" (borderline)" if d.borderline else ""),
            str(d.tokens),
            duration(d.seconds),
            ("~ " if d.full_run_is_rough else "") + duration(d.full_run_s),
        )
    c = _console()
    c.print(t)
    c.print(
        f"L from {budget.source}; ADMIT iff alpha * D_hat <= L (boundary D = {budget.line / alpha:.4g})."
    )
    c.print(
        "D_hat: token-pooled k1 of the candidate engine vs the BF16 student on its own samples; "
        "CI: bootstrap over prompts. borderline: the CI straddles the boundary."
    )
    total = sum(d.seconds for d in decisions)
    fulls = sorted(d.full_run_s for d in decisions)
    span = duration(fulls[0])
    if fulls[0] != fulls[-1]:
        span += f" to {duration(fulls[-1])}"
    c.print(
        f"checking {len(decisions)} candidate(s) took {duration(total)}; one full run of "
        f"{cfg.train.steps} steps takes about {span} (train.steps x responses/step x "
        f"seconds/response, without actor start-up; seconds/response {speed_source})."
    )


def _drift_table(windows, d_hat: float, alpha: float, run_path: str, recipe: str) -> None:
    from rich.table import Table

    from opdflow.commands.console import fmt

    t = Table(title=f"drift: online D in {run_path} vs admission D_hat = {d_hat:.4g} ({recipe})")
    for col in (
        "steps",
        "d_engine online",
        "ratio",
        "d_total online",
        "ratio",
        f"> alpha={alpha:g}?",
    ):
        t.add_column(col, justify="right")
    for i, w in enumerate(windows):
        label = "all" if i == len(windows) - 1 else f"{w.first_step}-{w.last_step}"
        t.add_row(
            label,
            fmt(w.d_engine, ".4g"),
            f"{w.ratio_engine:.2f}x",
            fmt(w.d_total, ".4g"),
            f"{w.ratio_total:.2f}x",
            "[red]PAST MARGIN[/]" if w.past_margin else "ok",
        )
    _console().print(t)
    _console().print(
        "ratio = online token-pooled mismatch / offline D_hat; the margin alpha assumes "
        "training mismatch stays within alpha x the estimate (judged on d_engine)."
    )


@click.command()
@pipeline_argument
@click.option("--recipe", "recipes", multiple=True, required=True, help="Candidate (repeatable).")
@click.option("--budget", "line", type=float, default=None, help="The line L, nats/token.")
@click.option(
    "--budget-file", type=click.Path(), default=None, help="Budget JSON from opdflow calibrate."
)
@click.option("--alpha", type=float, default=1.5, show_default=True, help="Safety margin.")
@click.option("--prompts", type=int, default=16, show_default=True, help="Problems measured.")
@click.option("--responses", type=int, default=2, show_default=True, help="Responses per problem.")
@seed_option
@click.option(
    "--against",
    type=click.Path(),
    default=None,
    help="A finished run: report its online D vs this estimate (drift).",
)
@set_option
@json_option("the decisions")
def admit(
    pipeline: str,
    recipes: tuple[str, ...],
    line: float | None,
    budget_file: str | None,
    alpha: float,
    prompts: int,
    responses: int,
    seed: int,
    against: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Admit or reject rollout engine recipes for PIPELINE before training with them.

    Exit code 0 when every candidate is admitted, 1 when any is rejected.
    """
    from rich.console import Console

    from opdflow.analysis.admission import decide, drift_report, load_budget
    from opdflow.analysis.measure import measure_recipes
    from opdflow.cluster.connection import quiet_env
    from opdflow.config.loader import load_pipeline
    from opdflow.core.duration import duration

    quiet_env()
    cfg = load_pipeline(pipeline, list(overrides))
    budget = load_budget(budget_file, line)
    err = Console(stderr=True)
    run = speed = None
    speed_source = "from this check (generation + rescoring, engine start-up included): rough"
    if budget.step_s_per_response:
        speed = budget.step_s_per_response
        speed_source = "from the median step time of the budget file's standard run"
    if against:
        from opdflow.analysis.calibration import step_cost
        from opdflow.analysis.quality import load_run

        run = load_run(against)
        if _canonical(run.recipe) not in map(_canonical, recipes) and len(recipes) > 1:
            raise click.UsageError(
                f"--against {against}: its recipe {run.recipe!r} is not among the candidates "
                f"{list(recipes)}; add --recipe '{run.recipe}'"
            )
        data = run.config["data"]
        n = data["prompts_per_step"] * data["responses_per_prompt"]
        speed = step_cost(run.metrics, n) or speed
        speed_source = f"from the median step time of {against}"
    n = len(recipes)
    head = f"{prompts} problems x {responses} responses"
    with err.status(f"[1/{n}] loading the student, measuring {recipes[0]}: {head}") as status:
        done = []

        def progress(message: str) -> None:  # measure_recipes logs one line per candidate
            err.print(f"  {message}")
            if ": D k1" in message:
                done.append(message)
                if len(done) < n:
                    status.update(f"[{len(done) + 1}/{n}] measuring {recipes[len(done)]}: {head}")

        measurements = measure_recipes(
            cfg,
            list(recipes),
            num_prompts=prompts,
            responses_per_prompt=responses,
            seed=seed,
            on_progress=progress,
        )
    decisions = []
    for i, m in enumerate(measurements, 1):
        d = decide(cfg, m, budget, alpha, speed)
        decisions.append(d)
        err.print(
            f"[{i}/{n}] {d.recipe}: D_hat {d.d_hat:.4g} [{d.ci_low:.4g}, {d.ci_high:.4g}] "
            f"-> {d.decision} ({duration(d.seconds)})"
        )
    drift = None
    if run is not None:
        want = _canonical(run.recipe)
        match = next((d for d in decisions if _canonical(d.recipe) == want), decisions[0])
        drift = (match, drift_report(run.metrics, match.d_hat, alpha), run)
    if as_json:
        out = {
            "budget": {"line_nats": budget.line, "source": budget.source, "alpha": alpha},
            "full_run_speed": speed_source,
            "decisions": [d.to_dict() for d in decisions],
        }
        if drift:
            from dataclasses import asdict

            out["drift"] = {"run": str(drift[2].path), "windows": [asdict(w) for w in drift[1]]}
        click.echo(json.dumps(out, indent=2))
    else:
        _admit_table(decisions, budget, alpha, cfg, speed_source)
        if drift:
            _drift_table(drift[1], drift[0].d_hat, alpha, str(drift[2].path), drift[0].recipe)
    sys.exit(0 if all(d.admit for d in decisions) else 1)
