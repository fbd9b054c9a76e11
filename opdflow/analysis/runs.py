"""A finished run as read from its directory: the one reader every analysis uses.

`opdflow run` leaves config.json, metrics.parquet (a row per learner step),
heldout.parquet (per-prompt held-out KL per evaluated version), spans.parquet (when the
profiler recorded spans) and summary.json (record/rundir.py and the profiler write them).
`Run` reads each file the first time it is asked for, so the report, the quality rule,
calibration, the sweep table, the simulator and the study read only what they use;
`read_run` refuses a directory that lacks a file its caller needs, naming the file, what
writes it and why it is needed. Missing optional files read as empty.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from opdflow.config import StalenessConfig
from opdflow.core.policy import KToken, k_label, token_of
from opdflow.core.staleness import StepObservation
from opdflow.errors import ConfigError
from opdflow.record.rundir import read_table


class Run:
    """One run directory's records, each read on first use."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def _table(self, name: str) -> list[dict[str, Any]]:
        f = self.path / name
        return read_table(f) if f.is_file() else []

    def _json(self, name: str) -> dict[str, Any]:
        f = self.path / name
        return json.loads(f.read_text()) if f.is_file() else {}

    @cached_property
    def config(self) -> dict[str, Any]:
        """config.json: the resolved pipeline config ({} when absent)."""
        return self._json("config.json")

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        """metrics.parquet: one row per learner step, in step order."""
        return self._table("metrics.parquet")

    @cached_property
    def heldout(self) -> list[dict[str, Any]]:
        """heldout.parquet: one row per (evaluated version, held-out prompt)."""
        return self._table("heldout.parquet")

    @cached_property
    def spans(self) -> list[dict[str, Any]]:
        """spans.parquet: one row per piece of work of a stage actor ([] when not profiled)."""
        return self._table("spans.parquet")

    @cached_property
    def events(self) -> list[dict[str, Any]]:
        """events.jsonl: restarts, resumes, rewinds, losses, in order ([] when absent)."""
        f = self.path / "events.jsonl"
        lines = f.read_text().splitlines() if f.is_file() else []
        return [json.loads(line) for line in lines if line.strip()]

    @cached_property
    def summary(self) -> dict[str, Any]:
        """summary.json: what the controller wrote at the end ({} when the run did not finish)."""
        return self._json("summary.json")

    # ------------------------------------------------------------------ what runs are told by

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recipe(self) -> str:
        return str(self.config.get("engine", {}).get("recipe", "?"))

    @property
    def warmup_steps(self) -> int:
        return int(self.config.get("warmup_steps", 0) or 0)

    @property
    def k(self) -> int | None:
        """staleness.k of the config (the adaptive policy's starting k)."""
        return self.config.get("staleness", {}).get("k")

    @property
    def staleness(self) -> StalenessConfig:
        """The run's staleness settings (make_policy turns them into a fresh policy)."""
        return StalenessConfig(**self.config.get("staleness", {}))

    @property
    def k_token(self) -> KToken | None:
        """The run's staleness as a sweep token: its fixed k, or "adaptive"."""
        s = self.config.get("staleness", {})
        return None if "k" not in s else token_of(s.get("policy", "fixed"), s["k"])

    @property
    def label(self) -> str:
        """How plots name the run: directory, staleness and recipe."""
        staleness = "k=?" if self.k_token is None else k_label(self.k_token)
        return f"{self.name} ({staleness}, {self.recipe})"

    def observations(self) -> list[StepObservation]:
        """What each learner step reported to the staleness policy, from its metrics row
        (core/launch.py's `replay` checks a run against the launch rule with them)."""
        return [
            StepObservation(
                int(r["step"]),
                r["trainer_wait_s"],
                r["step_s"],
                r["d_stale_k1"],
                int(r["staleness"]),
            )
            for r in self.metrics
        ]

    # ------------------------------------------------------------------ held-out rows

    @property
    def versions(self) -> list[int]:
        """Evaluated weight versions, in order."""
        return sorted({int(r["version"]) for r in self.heldout})

    def heldout_at(self, version: int) -> list[dict[str, Any]]:
        """One evaluation's rows, in prompt order."""
        return sorted(
            (r for r in self.heldout if int(r["version"]) == version),
            key=lambda r: int(r["prompt_index"]),
        )


def read_run(path: str | Path, need: tuple[str, ...] = (), why: str = "") -> Run:
    """The run in `path`; refuses a missing directory or one lacking a file in `need`.

    `why` finishes the message: what the caller needs the files for and how to get them.
    """
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"run directory {p} not found")
    for name in need:
        if not (p / name).is_file():
            raise ConfigError(f"{p / name} is missing: {why or 'not a finished run directory'}")
    return Run(p)


def is_run_dir(path: Path) -> bool:
    """A directory a run wrote metrics into."""
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
