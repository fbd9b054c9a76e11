"""The noise ladder of `opdflow calibrate --short`: short runs of one pipeline at the bf16
standard and at noise(sigma) for each sigma, in one Session.

Each run goes to OUT/<recipe> (noise(1.5) -> noise-1.5); a finished run of the same config
there is reused, not rerun, so an interrupted ladder continues where it stopped. What the
runs mean for the budget line is analysis/calibration.py's.
"""

from __future__ import annotations

from pathlib import Path

from opdflow.config.loader import load_pipeline
from opdflow.driver.session import Session, Unwatched, Watch


def run_ladder(
    pipeline: str,
    overrides: list[str],
    sigmas: list[float],
    steps: int,
    out_dir: str | Path,
    watch: Watch | None = None,
) -> list[Path]:
    """Train (or reuse) the bf16 standard, then noise(sigma) for each sigma, `steps` steps
    each with held-out KL at the start and the end; returns their run directories (the
    standard's first)."""
    watch = watch or Unwatched()
    recipes = ["bf16"] + [f"noise({s:g})" for s in sigmas]
    paths = []
    with Session() as session:
        for i, recipe in enumerate(recipes, 1):
            extra = [f"engine.recipe={recipe}", f"train.steps={steps}", f"eval.every={steps}"]
            cfg = load_pipeline(pipeline, [*overrides, *extra])
            path = Path(out_dir) / recipe.replace("(", "-").replace(")", "")
            session.run_watched(watch, f"[{i}/{len(recipes)}] {recipe}", cfg, path, reuse=True)
            paths.append(path)
    return paths
