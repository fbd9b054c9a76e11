"""One OPD run as one value: PipelineConfig, its sections, and its check across sections.

A run directory's config.json is `to_dict()`; `from_dict` reads it back with unknown fields
named. Each section validates itself; `validate` adds the rules that span sections.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from opdflow.config.data import DataConfig
from opdflow.config.engine import EngineConfig
from opdflow.config.evaluation import EvalConfig
from opdflow.config.models import ModelsConfig
from opdflow.config.reliability import ReliabilityConfig
from opdflow.config.resources import ResourcesConfig
from opdflow.config.rules import check_types, fail, nonnegative, unknown_field
from opdflow.config.staleness import StalenessConfig
from opdflow.config.trackers import LoggingConfig
from opdflow.config.train import TrainConfig
from opdflow.config.weights import WeightsConfig
from opdflow.errors import ConfigError


@dataclass
class PipelineConfig:
    """One OPD run: student, teacher, data, rollout engine, staleness, steps."""

    name: str = "opd"
    """Run name, used in the run directory's name."""
    seed: int = 0
    """Seed of data order, sampling and initialisation of the learner."""
    run_dir: str | None = None
    """Run directory; default runs/<name>-<timestamp>."""
    warmup_steps: int = 2
    """Steps excluded from updates/hour (actor start, first weight fetch)."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """Student and teacher."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Rollout engine."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Learner."""
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    """Staleness bound and policy."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out KL."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """Ray resources per stage."""
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    """Fault handling and checkpoints."""
    log: LoggingConfig = field(default_factory=LoggingConfig)
    """Trackers fed once per step (metrics.parquet always; TensorBoard, W&B, MLflow on request)."""
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    """How weights versions reach the consumers (object store or a collective)."""

    def validate(self) -> PipelineConfig:
        if (
            not isinstance(self.name, str)
            or not self.name.replace("-", "").replace("_", "").isalnum()
        ):
            fail("name", self.name, "letters, digits, '-' and '_'")
        nonnegative("warmup_steps", self.warmup_steps)
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if dataclasses.is_dataclass(sub):
                sub.validate(f.name)
        row = self.data.max_prompt_tokens + self.engine.max_new_tokens
        if 0 < self.train.micro_batch_tokens < row:
            fail(
                "train.micro_batch_tokens",
                self.train.micro_batch_tokens,
                f">= data.max_prompt_tokens + engine.max_new_tokens = {row} (a response is "
                "never split across micro-batches), or 0 for the whole batch in one forward",
            )
        r = self.resources
        consumers = {n: getattr(r, n).num_gpus for n in ("generator", "rescorer", "evaluator")}
        if self.weights.transport == "collective" and r.learner.num_gpus > 0:
            cpu = [n for n, g in consumers.items() if not g > 0]
            if cpu:
                fail("weights.transport", "collective",
                     f"'object_store' or 'auto': the learner has a GPU, so the collective is "
                     f"NCCL, which needs every consumer on a GPU too ({', '.join(cpu)} "
                     "have none)")  # fmt: skip
        if self.models.tiny.student == "carry_blind" and not self.data.task.worked:
            fail("models.tiny.student", "carry_blind", "'checkpoint' unless data.task.worked=true")
        check_types(self, "")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipelineConfig:
        return _from_dict(cls, data, "").validate()


def _from_dict(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            unknown_field(prefix, key, cls)
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = _from_dict(hint, value, f"{prefix}{key}.")
        kwargs[key] = value
    return cls(**kwargs)
