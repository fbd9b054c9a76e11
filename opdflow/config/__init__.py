"""Config: the schema of a run, one dataclass per section, validated at load.

A pipeline file is plain Python whose function returns one `PipelineConfig`; variants are
more functions. Everything a run needs is in it, so a run directory's `config.json` fully
describes the run and `--set a.b=v` reaches every field. Every field has a docstring.

What lives here: this module is the schema's public face (`from opdflow.config import
PipelineConfig, TrainConfig, ...`, as pipeline files write it). pipeline.py holds
PipelineConfig and its cross-section rules; models.py, data.py, engine.py, train.py,
staleness.py, evaluation.py, resources.py, reliability.py, trackers.py and weights.py one
section each; rules.py the validation rules they share. loader.py loads pipeline files and
overrides.py applies `--set`: import those from their own modules.

May import: opdflow.errors, opdflow.core (the recipe grammar); nothing heavy. Imported by
every folder but core/, and by pipeline files.
"""

from opdflow.config.data import DataConfig, TaskSpec
from opdflow.config.engine import EngineConfig
from opdflow.config.evaluation import EvalConfig
from opdflow.config.models import ModelsConfig, TinyModelSpec
from opdflow.config.pipeline import PipelineConfig
from opdflow.config.reliability import ReliabilityConfig
from opdflow.config.resources import (
    STAGES,
    STRATEGIES,
    LearnerResources,
    PlacementConfig,
    ResourcesConfig,
    StageResources,
)
from opdflow.config.staleness import StalenessConfig
from opdflow.config.trackers import LoggingConfig
from opdflow.config.train import TrainConfig
from opdflow.config.weights import WeightsConfig

__all__ = [
    "STAGES",
    "STRATEGIES",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "LearnerResources",
    "LoggingConfig",
    "ModelsConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ReliabilityConfig",
    "ResourcesConfig",
    "StageResources",
    "StalenessConfig",
    "TaskSpec",
    "TinyModelSpec",
    "TrainConfig",
    "WeightsConfig",
]
