"""Which experiment trackers a run feeds besides its metrics.parquet."""

from __future__ import annotations

from dataclasses import dataclass, field

from opdflow.config.rules import fail, one_of


@dataclass
class LoggingConfig:
    """Where per-step metrics go besides the run directory's metrics.parquet (always written)."""

    sinks: list[str] = field(default_factory=list)
    """Extra trackers, any of "tensorboard", "wandb", "mlflow" (each an extra: pip install
    'opdflow[wandb]'); metric names are the metrics.parquet columns. CLI: --log wandb,mlflow."""
    project: str = "opdflow"
    """W&B project and MLflow experiment the run is logged under."""
    wandb_entity: str | None = None
    """W&B entity (user or team); None = your default entity."""
    wandb_mode: str | None = None
    """W&B mode: "online", "offline" (files under the run directory) or "disabled";
    None = $WANDB_MODE or wandb's default."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI, e.g. "http://mlflow:5000" or "sqlite:////abs/mlflow.db";
    None = $MLFLOW_TRACKING_URI, else sqlite:///<run_dir>/mlflow.db. A file store (file:// or
    a plain path) is refused: MLflow 3 keeps it in maintenance mode."""
    tensorboard_dir: str | None = None
    """TensorBoard event directory; None = <run_dir>/tensorboard."""

    def validate(self, path: str) -> None:
        for i, sink in enumerate(self.sinks):
            one_of(f"{path}.sinks[{i}]", sink, ("parquet", "tensorboard", "wandb", "mlflow"))
        if self.wandb_mode is not None:
            one_of(f"{path}.wandb_mode", self.wandb_mode, ("online", "offline", "disabled"))
        if not isinstance(self.project, str) or not self.project.strip():
            fail(f"{path}.project", self.project, "a non-empty name")
