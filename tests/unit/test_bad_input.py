"""Bad input is refused with an error naming what, where and how to fix it; nothing half-written.

Together with test_config.py and test_data.py these are the run's input checks (issue:
"bad input refused"): pipeline files, config fields, recipes, data files, checkpoints,
run directories.
"""

import json
import shutil

import pytest
from click.testing import CliRunner

from opdflow.cli import main
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.session import open_resume
from opdflow.errors import ConfigError
from opdflow.inputs.models import resolve_models
from opdflow.record.rundir import RunDir


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (
            "fp9",
            r"engine\.recipe: recipe 'fp9': unknown recipe 'fp9'; known recipes: bf16, fp8, fp8_kv",
        ),
        ("noise(", r"engine\.recipe: recipe 'noise\(' is malformed"),
        (
            "noise(abc)",
            r"engine\.recipe: recipe 'noise\(abc\)': sigma='abc' is not allowed; expected a number",
        ),
        ("noise", r"engine\.recipe: .*noise needs sigma"),
    ],
)
def test_recipe_errors(recipe, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(PipelineConfig(), [f"engine.recipe={recipe}"])


def _models(tmp_path, tiny, **changes):
    cfg = apply_overrides(PipelineConfig(), [])
    cfg.models.student = str(changes.get("student", tiny.student))
    cfg.models.teacher = str(changes.get("teacher", tiny.teacher))
    cfg.data.train = cfg.data.heldout = str(tiny.train)
    return cfg


def _checkpoint_copy(tmp_path, tiny, name):
    d = tmp_path / name
    shutil.copytree(tiny.student, d)
    for f in tiny.tokenizer.iterdir():
        shutil.copy(f, d / f.name)
    return d


def test_checkpoint_directory_missing(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"models\.student = .*nowhere.*directory not found"):
        resolve_models(_models(tmp_path, tiny, student=tmp_path / "nowhere"))


def test_checkpoint_without_config_json(tmp_path, tiny):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    (d / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"models\.student = .*no config\.json.*save_pretrained"):
        resolve_models(_models(tmp_path, tiny, student=d, teacher=d))


def test_checkpoint_without_safetensors(tmp_path, tiny):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    for f in d.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ConfigError, match=r"no \*\.safetensors weights.*safe_serialization=True"):
        resolve_models(_models(tmp_path, tiny, student=d, teacher=d))


def test_checkpoint_of_the_wrong_architecture(tmp_path, tiny):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "vit"
    config["architectures"] = ["ViTModel"]
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"model_type 'vit' is not a causal language model"):
        resolve_models(_models(tmp_path, tiny, student=d, teacher=d))


def test_student_and_teacher_tokenizers_differ(tmp_path, tiny):
    from opdflow.testbed.tokenizer import build_char_tokenizer

    student = _checkpoint_copy(tmp_path, tiny, "s")
    teacher = _checkpoint_copy(tmp_path, tiny, "t")
    build_char_tokenizer("0123456789+-=Q:", teacher)  # one more symbol: another vocabulary
    with pytest.raises(ConfigError, match=r"models\.teacher = .*different tokenizer vocabulary"):
        resolve_models(_models(tmp_path, tiny, student=student, teacher=teacher))


def test_only_one_of_student_and_teacher_is_tiny(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"models\.teacher = .*both student and teacher"):
        apply_overrides(PipelineConfig(), [f"models.teacher={tiny.teacher}"])


def test_existing_run_directory_is_never_overwritten(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.parquet").write_text("precious")
    with pytest.raises(ConfigError, match=r"already exists and is not empty.*--resume"):
        RunDir.create(PipelineConfig(), d)
    assert (d / "metrics.parquet").read_text() == "precious"


def test_resume_refusals(tmp_path):
    with pytest.raises(ConfigError, match=r"--resume .*not a run directory \(no config\.json"):
        open_resume(PipelineConfig(), str(tmp_path))
    cfg = PipelineConfig()
    run = RunDir.create(cfg, tmp_path / "run")
    with pytest.raises(
        ConfigError, match=r"no complete checkpoint in .*checkpoints; start a new run"
    ):
        open_resume(cfg, str(run.path))
    more_workers = apply_overrides(PipelineConfig(), ["resources.learner.workers=2"])
    with pytest.raises(ConfigError, match=r"no complete checkpoint"):  # not "differs"
        open_resume(more_workers, str(run.path))
    changed = apply_overrides(PipelineConfig(), ["train.lr=5e-4", "staleness.k=3"])
    with pytest.raises(
        ConfigError, match=r"differs .* staleness\.k \(2 in the run, 3 now\); train\.lr"
    ):
        open_resume(changed, str(run.path))


def test_cli_refuses_bad_pipelines_with_exit_code_2_and_writes_nothing(tmp_path):
    runner = CliRunner()
    out_dir = tmp_path / "run"
    bad = tmp_path / "p.py"
    bad.write_text("def pipeline():\n    return 3\n")
    result = runner.invoke(main, ["run", str(bad), "--run-dir", str(out_dir)])
    assert result.exit_code == 2
    assert "returned int, expected opdflow.config.PipelineConfig" in result.output
    result = runner.invoke(
        main, ["run", "pipelines/tiny_cpu.py", "--set", "staleness.k=-1", "--run-dir", str(out_dir)]
    )
    assert result.exit_code == 2
    assert "staleness.k = -1" in result.output
    result = runner.invoke(
        main, ["run", "pipelines/tiny_cpu.py", "--run-dir", str(out_dir), "--resume", str(out_dir)]
    )
    assert result.exit_code == 2
    assert "either --run-dir" in result.output
    assert not out_dir.exists()


def test_cli_bad_data_file_leaves_no_half_written_run(tmp_path, tiny):
    out_dir = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "run",
            "pipelines/tiny_cpu.py",
            "--set",
            f"data.train={tmp_path / 'missing.parquet'}",
            "--run-dir",
            str(out_dir),
        ],
    )
    assert result.exit_code == 2
    assert "missing.parquet not found" in result.output
    assert not out_dir.exists()


def test_more_heldout_prompts_than_the_file_has(tmp_path, tiny):
    result = CliRunner().invoke(
        main,
        [
            "run",
            "pipelines/tiny_cpu.py",
            "--set",
            "eval.prompts=100000",
            "--run-dir",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2
    assert "eval.prompts = 100000 but" in result.output
    assert not (tmp_path / "run").exists()


def _cli_refuses(tmp_path, *args: str) -> str:
    """`opdflow run pipelines/tiny_cpu.py ARGS` exits 2 with one error line, no traceback and
    no run directory; returns that line."""
    out_dir = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["run", "pipelines/tiny_cpu.py", "--run-dir", str(out_dir), *args]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    assert not out_dir.exists()
    return lines[0]


@pytest.mark.parametrize("size", [300, -1])  # a cut header; a header whose data is one byte short
def test_cli_refuses_a_truncated_safetensors_file(tmp_path, tiny, size):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:size])
    line = _cli_refuses(
        tmp_path, "--set", f"models.student={d}", "--set", f"models.teacher={tiny.teacher}"
    )
    assert "models.student = " in line and str(weights) in line
    assert "truncated or corrupt: copy or save it again" in line


def test_cli_refuses_a_checkpoint_without_a_causal_lm_head(tmp_path, tiny):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "bert"  # in transformers' causal-LM mapping (BertLMHeadModel) ...
    config["architectures"] = ["BertModel"]  # ... but an encoder without an LM head
    (d / "config.json").write_text(json.dumps(config))
    line = _cli_refuses(
        tmp_path, "--set", f"models.student={tiny.student}", "--set", f"models.teacher={d}"
    )
    assert "models.teacher = " in line
    assert "architectures 'BertModel' (model_type 'bert') is not a causal language model" in line
    assert "BertLMHeadModel" in line


def test_a_missing_shard_of_a_sharded_checkpoint(tmp_path, tiny):
    d = _checkpoint_copy(tmp_path, tiny, "s")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"lists model-00002-of-00002\.safetensors but it is not"):
        resolve_models(_models(tmp_path, tiny, student=d, teacher=d))


def test_cli_refuses_an_mlflow_file_store(tmp_path, tiny, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{store}")
    line = _cli_refuses(tmp_path, "--log", "mlflow")
    assert f"MLFLOW_TRACKING_URI = 'file://{store}' is an MLflow file store" in line
    assert f"MLFLOW_TRACKING_URI=sqlite:///{store / 'mlflow.db'}" in line
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    line = _cli_refuses(tmp_path, "--log", "mlflow", "--set", f"log.mlflow_tracking_uri={store}")
    assert f"log.mlflow_tracking_uri = '{store}' is an MLflow file store" in line
    assert not store.exists()


def test_mlflow_defaults_to_sqlite_in_the_run_directory(tmp_path, monkeypatch):
    from opdflow.record.trackers import mlflow_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = PipelineConfig()
    assert mlflow_tracking_uri(cfg, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert mlflow_tracking_uri(cfg, tmp_path) == "http://127.0.0.1:5000"
    cfg.log.mlflow_tracking_uri = "sqlite:////elsewhere/m.db"  # the config wins over the env
    assert mlflow_tracking_uri(cfg, tmp_path) == "sqlite:////elsewhere/m.db"


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.10.2", False),
        ("0.18.1", False),
        ("0.19.0rc1", False),  # a release candidate comes before the release
        ("not-a-version", False),
        ("0.19.0", True),
        ("0.32.0+cpu", True),
        ("0.33.0", True),
        ("1.0.0", True),
    ],
)
def test_vllm_version_floor(version, ok):
    from opdflow.engines.vllm_version import VLLM_MIN, check_vllm_version

    assert VLLM_MIN == "0.19.0"
    if ok:
        check_vllm_version(version)
    else:
        with pytest.raises(ConfigError, match=rf"needs vLLM >= 0\.19\.0 .*vLLM {version} is"):
            check_vllm_version(version)


def test_cli_run_refuses_an_old_or_missing_vllm_before_anything_starts(tmp_path, monkeypatch):
    import opdflow.cluster.connection
    import opdflow.engines.vllm_version as vllm_version

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(opdflow.cluster.connection, "connect", no_ray)
    out_dir = tmp_path / "run"
    args = ["run", "pipelines/tiny_cpu.py", "--set", "engine.kind=vllm", "--run-dir", str(out_dir)]
    monkeypatch.setattr(vllm_version, "installed_vllm", lambda: "0.10.2")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "engine.kind = 'vllm' needs vLLM >= 0.19.0" in result.output
    assert "vLLM 0.10.2 is installed" in result.output
    monkeypatch.setattr(vllm_version, "installed_vllm", lambda: None)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "which is not installed here" in result.output
    assert not out_dir.exists()
