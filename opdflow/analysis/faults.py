"""What faults cost a run, read off its record: restarts, node losses, learner losses.

Each function reads a finished (or running) run's metrics rows and events.jsonl, so the
summary, the report and the tests read one definition of each cost. Like updates/hour,
every cost counts the steps after warm-up only (figures.timed_rows: a slow warm-up step is
neither clean time nor a fault's).
"""

from __future__ import annotations

from typing import Any

from opdflow.analysis.figures import per_hour, timed_rows


def restart_slowdown(metrics: list[dict[str, Any]], warmup: int = 0, first: int = 0) -> float:
    """Share of updates/hour lost to restarts: 1 - (mean step time of steps no restart hit)
    / (mean step time of all steps), over the steps after warm-up; a step a restart hit
    and the one after it count as hit. 0 without restarts, NaN when every step was hit."""
    rows = timed_rows(metrics, warmup, first)
    hit = {r["step"] for r in rows if r.get("restarts", 0)}
    if not rows or not hit:
        return 0.0
    hit |= {s + 1 for s in hit}
    clean = [r["step_s"] for r in rows if r["step"] not in hit]
    if not clean:
        return float("nan")
    mean_all = sum(r["step_s"] for r in rows) / len(rows)
    return max(0.0, 1.0 - (sum(clean) / len(clean)) / mean_all)


def node_losses(
    events: list[dict[str, Any]], metrics: list[dict[str, Any]], warmup: int = 0, first: int = 0
) -> list[dict]:
    """Each node loss of a run: node, stages, step, steps replayed, seconds to recover
    (None if never), and what it cost. The steps from the loss to the recovery and the one
    after are "hit"; the others are clean: seconds lost = the hit steps' time beyond the
    clean mean step, updates lost = that over the clean step, updates/hour lost = the clean
    rate minus the rate with those seconds added (over the steps after warm-up)."""
    import math

    metrics = timed_rows(metrics, warmup, first)
    back = {e["node_id"]: e for e in events if e.get("event") == "node_recovered"}
    lost = [e for e in events if e.get("event") == "node_lost"]
    out = []
    for e in lost:
        rec = back.get(e["node_id"])
        end = rec["step"] if rec else (metrics[-1]["step"] if metrics else e["step"])
        hit = set(range(e["step"], end + 2))
        clean = [r["step_s"] for r in metrics if r["step"] not in hit]
        hit_s = [r["step_s"] for r in metrics if r["step"] in hit]
        mean = sum(clean) / len(clean) if clean else math.nan
        seconds_lost = max(0.0, sum(hit_s) - mean * len(hit_s)) if clean else math.nan
        n = len(metrics)
        uph_clean = per_hour(1, mean) if clean else math.nan
        uph_with = per_hour(n, n * mean + seconds_lost) if clean else math.nan
        out.append({
            "node": e["node"], "stages": e["stages"], "actors": e["actors"], "step": e["step"],
            "steps_replayed": len(e["steps_replayed"]), "replayed": e["steps_replayed"],
            "seconds_to_recover": rec["seconds"] if rec else None,
            "seconds_lost": seconds_lost, "updates_lost": seconds_lost / mean if clean else math.nan,
            "updates_per_hour_lost": uph_clean - uph_with,
            "share_of_updates_per_hour": (uph_clean - uph_with) / uph_clean if clean else math.nan,
        })  # fmt: skip
    return out


def learner_losses(
    events: list[dict[str, Any]], updates_per_hour: float, timed_steps: int
) -> list[dict[str, Any]]:
    """Each learner recovery of a run (its `learner_recovered` events) with what it cost:
    `lost_s` (work thrown away + recovery), its share of the run's timed wall time, and
    `updates_per_hour_lost`: the run's rate had those seconds not been spent, minus the rate
    it had. `timed_steps`: the steps updates/hour counts."""
    wall = 3600 * timed_steps / updates_per_hour if updates_per_hour > 0 else float("nan")
    keep = ("from_step", "to_step", "replayed_steps", "recover_s", "group_s", "load_s",
            "wasted_s", "ranks", "nodes", "workers_before", "workers_after")  # fmt: skip
    out = []
    for e in events:
        if e.get("event") != "learner_recovered":
            continue
        lost_s = e["wasted_s"] + e["recover_s"]
        without = per_hour(timed_steps, wall - lost_s) if wall > lost_s else float("nan")
        out.append({**{k: e.get(k) for k in keep}, "lost_s": lost_s,
                    "lost_share": lost_s / wall if wall > 0 else float("nan"),
                    "updates_per_hour_lost": without - updates_per_hour})  # fmt: skip
    return out
