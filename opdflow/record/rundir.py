"""The run directory: everything a run leaves behind, written so nothing is lost.

config.json (resolved), metrics.parquet (one row per learner step), heldout.parquet
(per-prompt held-out KL per evaluated version, for paired statistics), events.jsonl
(decisions: staleness changes, dropped batches, stage restarts), summary.json, final/ (the
student as a Hugging Face checkpoint, export.py). Tables are rewritten
atomically (temporary file then rename) so a crash leaves the last complete copy.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


class RunDir:
    """A run's directory and its append-only records."""

    def __init__(self, path: Path):
        self.path = path
        self.metrics: list[dict[str, Any]] = []
        self.heldout: list[dict[str, Any]] = []

    @classmethod
    def create(cls, cfg: PipelineConfig, path: str | Path | None = None) -> RunDir:
        """A new run directory; refuses to reuse a non-empty one (resume it instead)."""
        p = Path(path) if path is not None else default_path(cfg)
        check_new(p)
        p.mkdir(parents=True, exist_ok=True)
        run = cls(p)
        run.write_json("config.json", cfg.to_dict())
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory with its records, to resume it."""
        p = Path(path)
        if not (p / "config.json").is_file():
            raise ConfigError(f"--resume {p}: not a run directory (no config.json in it)")
        run = cls(p)
        if (p / "metrics.parquet").is_file():
            run.metrics = read_table(p / "metrics.parquet")
        if (p / "heldout.parquet").is_file():
            run.heldout = read_table(p / "heldout.parquet")
        return run

    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    def truncate(self, step: int, event: str = "resume") -> None:
        """Forget records past a checkpoint at `step` (they are recomputed on resume, or
        after a learner's rewind: `event` names which)."""
        self.metrics = [r for r in self.metrics if r["step"] < step]
        self.heldout = [r for r in self.heldout if r["version"] <= step]
        _write_table(self.path / "metrics.parquet", self.metrics)
        if self.heldout or (self.path / "heldout.parquet").is_file():
            _write_table(self.path / "heldout.parquet", self.heldout)
        self.event(event, step=step)

    def write_json(self, name: str, data: Any) -> None:
        _atomic_write_bytes(self.path / name, json.dumps(data, indent=2, default=str).encode())

    def event(self, kind: str, **fields: Any) -> None:
        with open(self.path / "events.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "event": kind, **fields}, default=str) + "\n")

    def events(self) -> list[dict[str, Any]]:
        """events.jsonl, in order ([] before the first event)."""
        path = self.path / "events.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def restart_counts(self) -> dict[str, int]:
        """Stage actor restarts recorded in events.jsonl, per stage (restarts.py)."""
        counts: dict[str, int] = {}
        for e in self.events():
            if e.get("event") == "restart":
                counts[e["stage"]] = counts.get(e["stage"], 0) + 1
        return counts

    def add_metrics(self, row: dict[str, Any]) -> None:
        self.metrics.append(row)
        _write_table(self.path / "metrics.parquet", self.metrics)

    def rewrite_metrics(self) -> None:
        """Rewrite metrics.parquet after rows were completed in place (the profiler's columns)."""
        _write_table(self.path / "metrics.parquet", self.metrics)

    def add_heldout(self, rows: list[dict[str, Any]]) -> None:
        self.heldout.extend(rows)
        _write_table(self.path / "heldout.parquet", self.heldout)

    def write_heldout_responses(self, version: int, rows: list[dict[str, Any]]) -> Path:
        """heldout_responses/version_NNNNNN.parquet: one evaluation's responses (eval.save_responses)."""
        out = self.path / "heldout_responses"
        out.mkdir(exist_ok=True)
        path = out / f"version_{version:06d}.parquet"
        _write_table(path, rows)
        return path


def check_new(path: Path) -> None:
    """Refuse to start a new run in a directory that is not empty (resume it instead)."""
    if path.exists() and any(path.iterdir()):
        raise ConfigError(
            f"run directory {path} already exists and is not empty; choose another --run-dir "
            "or continue it with --resume"
        )


def default_path(cfg: PipelineConfig) -> Path:
    """Where a run goes when no directory is given: cfg.run_dir, else runs/NAME-TIME."""
    return Path(cfg.run_dir or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def same_config(path: str | Path, cfg: PipelineConfig) -> bool:
    """A run directory in `path` was made with exactly this config (run_dir aside). Fields
    added to the config since the run was made count as their defaults."""
    p = Path(path) / "config.json"
    if not p.is_file():
        return False
    try:
        done = PipelineConfig.from_dict(json.loads(p.read_text())).to_dict()
    except (ConfigError, ValueError, TypeError):
        return False
    want = cfg.to_dict()
    done.pop("run_dir", None), want.pop("run_dir", None)
    return json.dumps(done, default=str, sort_keys=True) == json.dumps(
        want, default=str, sort_keys=True
    )


def read_table(path: str | Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
