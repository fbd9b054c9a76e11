"""`opdflow run --log tensorboard,wandb,mlflow` on a real local Ray cluster, read back from
each sink; MLflow with its documented default backend (sqlite, here in the run directory)."""

import json

import pytest
from click.testing import CliRunner
from support.tracker_readers import mlflow_run, tensorboard_run, wandb_offline_run

from opdflow.analysis.report import write_report
from opdflow.cli import main
from opdflow.record.profiler import STEP_COLUMNS
from opdflow.record.rundir import read_table
from opdflow.record.trackers import scalars

STEPS = 3


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, ray_local, tiny):
    tmp = tmp_path_factory.mktemp("trackers")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DIR", str(tmp / "wandb-home"))  # wandb's own settings/cache, not the run
    mp.setenv("WANDB_CONFIG_DIR", str(tmp / "wandb-home"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # MLflow's default: opdflow's sqlite
    mp.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    path = tmp / "trk"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "pipelines/tiny_cpu.py:short_answers",
            "--steps",
            str(STEPS),
            "--log",
            "tensorboard,wandb,mlflow",
            "--run-dir",
            str(path),
            *("--set", f"eval.every={STEPS}", "--set", "warmup_steps=1"),
            *("--set", "log.wandb_mode=offline", "--set", "log.project=opdflow-test"),
        ],
    )
    mp.undo()
    assert result.exit_code == 0, result.output
    uri = f"sqlite:///{path.resolve() / 'mlflow.db'}"
    return path, uri, read_table(path / "metrics.parquet")


def _same_as_parquet(history, metrics, rel=1e-6):
    assert sorted(history) == [r["step"] for r in metrics] == list(range(STEPS))
    for row in metrics:
        expected = scalars(row)
        got = history[row["step"]]
        assert set(got) == set(expected), set(got) ^ set(expected)
        for key, value in expected.items():
            if key in STEP_COLUMNS:  # live estimates in sinks, recomputed in the parquet
                continue
            assert got[key] == pytest.approx(value, rel=rel, abs=1e-12), key


def test_metric_names_are_the_parquet_columns(logged_run):
    _, _, metrics = logged_run
    names = set(scalars(metrics[0]))
    for key in ("trainer_wait_s", "step_s", "d_engine_k1", "d_stale_k1", "loss", "time_s"):
        assert key in names
    assert names <= set(metrics[0])


def test_wandb_offline_run_reads_back(logged_run):
    path, _, metrics = logged_run
    history, config = wandb_offline_run(path)
    _same_as_parquet(history, metrics)
    assert config["recipe"] == "bf16" and config["k_policy"] == "fixed(k=2)"
    assert config["env.torch"].startswith("2.") and config["train.steps"] == STEPS


def test_mlflow_default_sqlite_store_reads_back(logged_run):
    path, uri, metrics = logged_run
    assert (path / "mlflow.db").is_file() and not (path / "mlruns").exists()
    history, params = mlflow_run(uri, "opdflow-test")
    _same_as_parquet(history, metrics)
    assert params["k_policy"] == "fixed(k=2)" and params["env.ray"].startswith("2.")
    assert params["train.steps"] == str(STEPS)


def test_tensorboard_events_read_back(logged_run):
    path, _, metrics = logged_run
    history, text = tensorboard_run(path / "tensorboard")
    _same_as_parquet(history, metrics, rel=1e-5)  # float32 in event files
    assert "| k_policy | fixed(k=2) |" in text and "| env.torch |" in text


def test_params_json_and_report_of_the_real_run(logged_run):
    path, _, _ = logged_run
    assert json.loads((path / "params.json").read_text())["recipe"] == "bf16"
    page = write_report([path]).read_text()
    assert "Held-out KL" in page and "trk" in page
    assert any(w in page for w in ("generation-bound", "trainer-bound", "balanced"))
    # a real run always has spans: every step's learner span, and the page draws them
    spans = read_table(path / "spans.parquet")
    assert sorted(s["step"] for s in spans if s["stage"] == "learner") == list(range(STEPS))
    assert "stage timeline of trk" in page and "no spans recorded" not in page
