"""Asynchrony throughput curve on the tiny pipeline, next to its overlap ceiling.

    PYTHONPATH=. python bench/async_curve.py [--steps 30] [--k 0,1,2,4] [--prompts 32] [--repeats 3]

Runs the tiny pipeline at each fixed k and once with the adaptive policy (k_max = the
largest k), in one Ray cluster. Cores: each generator replica and the learner reserve one
Ray CPU and run torch on one thread; the rescorer, teacher and evaluator reserve none
(they share the machine's cores with the others; their torch uses one thread each).

From each run's spans (after warm-up): g = per-step generation-side time (generator +
rescorer + teacher + their weight fetches), t = per-step learner time (train + publish).
Overlap ceiling (g + t) / max(g, t): the best async/sync speed-up if the two sides
overlapped perfectly at the synchronous run's stage times. Prints measured updates/hour
ratios to k = 0 next to it (across runs), the same ratio within each run ((g + t) / step
period, with that run's own stage times and ceiling), the adaptive run next to the best fixed k, and the trainer's
wait share at the k the adaptive policy chose. Goals: ratio >= 0.95 of the ceiling;
adaptive >= 0.95 of the best fixed k; wait share <= 2% at the chosen k.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def config(k: int | str, args: argparse.Namespace, k_max: int):
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.core.policy import settings_for

    cfg = apply_overrides(
        PipelineConfig(name=f"bench-{k}", warmup_steps=args.warmup),
        [
            f"train.steps={args.steps}",
            f"eval.every={args.steps}",
            "eval.prompts=8",
            "eval.samples_per_prompt=1",
            f"data.prompts_per_step={args.prompts}",
            f"data.responses_per_prompt={args.responses}",
            f"engine.max_new_tokens={args.max_new_tokens}",
            "resources.generator.num_cpus=1",
            "resources.generator.torch_threads=1",
            "resources.learner.num_cpus=1",
            "resources.learner.torch_threads=1",
        ],
    )
    cfg.staleness = settings_for(k, cfg.staleness, k_max)
    return cfg.validate()


def stage_times(run_dir: Path, warmup: int) -> tuple[float, float]:
    """Median per-step generation-side seconds g and learner seconds t after warm-up."""
    from opdflow.record.rundir import read_table

    g: dict[int, float] = {}
    t: dict[int, float] = {}
    for s in read_table(run_dir / "spans.parquet"):
        if s["step"] < warmup:
            continue
        sec = s["end_s"] - s["start_s"]
        if s["stage"] in ("generator", "rescorer", "teacher") or (
            s["stage"] == "fetch" and not s["actor"].startswith("evaluator")
        ):
            g[s["step"]] = g.get(s["step"], 0.0) + sec
        elif s["stage"] in ("learner", "publish"):
            t[s["step"]] = t.get(s["step"], 0.0) + sec
    return statistics.median(g.values()), statistics.median(t.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--k", default="0,1,2,4")
    p.add_argument("--prompts", type=int, default=32, help="data.prompts_per_step")
    p.add_argument("--responses", type=int, default=8, help="data.responses_per_prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--no-adaptive", action="store_true")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration (medians)")
    args = p.parse_args()
    from opdflow.core.policy import ADAPTIVE, parse_ks, sweep_k_max

    ks = [k for k in parse_ks(args.k) if k != ADAPTIVE]
    if 0 not in ks:
        ks = [0, *ks]

    from opdflow.driver.session import Session

    root = Path(tempfile.mkdtemp(prefix="async_curve-"))
    names: list[int | str] = [*ks, *([] if args.no_adaptive else [ADAPTIVE])]
    runs: dict[int | str, list[dict]] = {k: [] for k in names}
    with Session(need_cpus=3) as session:
        for rep in range(args.repeats):
            # rotate the order each repeat so slow drift of a shared machine hits every k alike
            for k in names[rep % len(names) :] + names[: rep % len(names)]:
                cfg = config(k, args, sweep_k_max(ks, 0))
                done = session.run(cfg, root / f"{k}-{rep}")
                s, run = done.summary, done.run
                g, t = stage_times(run.path, args.warmup)
                tail = run.metrics[-10:]
                runs[k].append(
                    {
                        "uph": s["updates_per_hour"],
                        "wait": s["trainer_wait_share"],
                        "g": g,
                        "t": t,
                        "k_final": run.metrics[-1]["k"],
                        "period": statistics.median(
                            r["step_s"] for r in run.metrics[args.warmup :]
                        ),
                        "wait_tail": sum(r["trainer_wait_s"] for r in tail)
                        / sum(r["step_s"] for r in tail),
                    }
                )
                print(
                    f"ran {k} (repeat {rep}): {s['updates_per_hour']:.0f} updates/h, "
                    f"wait {s['trainer_wait_share']:.1%}, g {g * 1e3:.0f} ms, t {t * 1e3:.0f} ms",
                    flush=True,
                )
    # medians over repeats (the adaptive run's chosen k: its most common final k)
    res = {
        k: {
            **{f: statistics.median(r[f] for r in rs) for f in rs[0] if f != "k_final"},
            "k_final": statistics.mode(r["k_final"] for r in rs),
        }
        for k, rs in runs.items()
    }

    g0, t0 = res[0]["g"], res[0]["t"]
    ceiling = (g0 + t0) / max(g0, t0)
    base = res[0]["uph"]
    print(
        f"\ntiny pipeline: {args.prompts} prompts x {args.responses} responses, "
        f"max_new_tokens {args.max_new_tokens}, {args.steps} steps ({args.warmup} warm-up), "
        f"median of {args.repeats} run(s) per configuration; "
        "generator 1 CPU/1 thread, learner 1 CPU/1 thread, rescorer+teacher+evaluator 0 CPU/1 "
        "thread each (shared cores)"
    )
    print(
        f"k=0 stage times: g = {g0 * 1e3:.0f} ms, t = {t0 * 1e3:.0f} ms -> ceiling {ceiling:.2f}x"
    )
    print(
        "across runs (updates/hour vs the k=0 run; runs are minutes apart, so load drift on a "
        "shared machine enters) and within each run (g, t, step period P of the same run: "
        "ratio (g + t) / P next to the ceiling (g + t) / max(g, t)):"
    )
    print(
        f"{'run':>9} {'updates/h':>10} {'vs k=0':>7} {'/ceil0':>7} | {'g ms':>6} {'t ms':>6} "
        f"{'P ms':>6} {'ratio':>6} {'ceiling':>8} {'/ceil':>6} | {'wait':>6}"
    )
    for k, r in res.items():
        ratio = r["uph"] / base
        own = (r["g"] + r["t"]) / max(r["g"], r["t"])
        within = (r["g"] + r["t"]) / r["period"]
        print(
            f"{k!s:>9} {r['uph']:>10.0f} {ratio:>6.2f}x {ratio / ceiling:>7.2f} | "
            f"{r['g'] * 1e3:>6.0f} {r['t'] * 1e3:>6.0f} {r['period'] * 1e3:>6.0f} "
            f"{within:>5.2f}x {own:>7.2f}x {within / own:>6.2f} | {r['wait']:>6.1%}"
        )
    fixed = {k: r for k, r in res.items() if k != ADAPTIVE}
    best_k = max(fixed, key=lambda k: fixed[k]["uph"])
    best_ratio = fixed[best_k]["uph"] / base
    print(
        f"\nbest fixed k={best_k}: {best_ratio:.2f}x = {best_ratio / ceiling:.2f} of the ceiling "
        f"(goal >= 0.95)"
    )
    if ADAPTIVE in res:
        a = res[ADAPTIVE]
        chosen = a["k_final"]
        print(
            f"adaptive: {a['uph']:.0f} updates/h = {a['uph'] / fixed[best_k]['uph']:.2f} of best "
            f"fixed (goal >= 0.95); chose k={chosen}; wait share at the chosen k: "
            f"{a['wait_tail']:.1%} over its last 10 steps"
            + (
                f", {fixed[chosen]['wait']:.1%} in the fixed k={chosen} run"
                if chosen in fixed
                else ""
            )
            + " (goal <= 2%)"
        )
    print(f"run directories: {root}")


if __name__ == "__main__":
    main()
