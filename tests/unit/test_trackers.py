"""Trackers without Ray: what reaches the sinks, parameters, config and missing extras."""

import json
import math
import sys

import numpy as np
import pytest

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.errors import ConfigError
from opdflow.record.rundir import RunDir, read_table
from opdflow.record.trackers import flatten, k_policy, open_trackers, run_params, scalars


def test_scalars_keeps_finite_numbers_under_their_own_names():
    row = {
        "step": 3,
        "loss": 0.5,
        "heldout_kl": float("nan"),
        "skipped": True,
        "tokens": 12,
        "recipe": "bf16",
        "d_engine_exact": np.float32(1e-4),
        "inf": math.inf,
    }
    out = scalars(row)
    assert out == {
        "loss": 0.5,
        "skipped": 1.0,
        "tokens": 12.0,
        "d_engine_exact": pytest.approx(1e-4),
    }


def test_params_hold_config_recipe_k_policy_and_versions():
    cfg = apply_overrides(PipelineConfig(), ["engine.recipe=noise(0.1)", "staleness.k=4"])
    p = run_params(cfg)
    assert p["recipe"] == "noise(0.1)" and p["k_policy"] == "fixed(k=4)"
    assert p["engine.recipe"] == "noise(0.1)" and p["staleness.k"] == 4
    assert p["env.torch"].startswith("2.") and p["env.ray"].startswith("2.")
    assert p["env.opdflow"] and p["env.vllm"]
    assert all(isinstance(v, int | float | str | bool) or v is None for v in p.values())
    adaptive = apply_overrides(PipelineConfig(), ["staleness.policy=adaptive", "staleness.k=1"])
    assert k_policy(adaptive).startswith("adaptive(k=1, k_max=8")


def test_flatten_nested_config():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2], "f": {}}) == {
        "a.b": 1,
        "a.c.d": "x",
        "e": "[1, 2]",
        "f": "{}",
    }


def test_parquet_sink_is_always_on_and_writes_each_row_once(tmp_path):
    cfg = PipelineConfig()
    run = RunDir.create(cfg, tmp_path / "run")
    tr = open_trackers(cfg, run)
    for step in range(3):
        tr.log_metrics(step, {"step": step, "loss": float(step)})
    tr.close()
    assert read_table(run.path / "metrics.parquet") == [
        {"step": s, "loss": float(s)} for s in range(3)
    ]
    assert json.loads((run.path / "params.json").read_text())["k_policy"] == "fixed(k=2)"


def test_log_sinks_validated_with_field_named():
    with pytest.raises(ConfigError, match=r"log.sinks\[1\] = 'wandbb'.*did you mean 'wandb'"):
        apply_overrides(PipelineConfig(), ['log.sinks=["tensorboard","wandbb"]'])
    with pytest.raises(ConfigError, match=r"log\.wandb_mode"):
        apply_overrides(PipelineConfig(), ["log.wandb_mode=offlne"])


@pytest.mark.parametrize(
    ("sink", "module"), [("wandb", "wandb"), ("mlflow", "mlflow"), ("tensorboard", "tensorboard")]
)
def test_missing_package_names_the_extra(tmp_path, monkeypatch, sink, module):
    # A None entry in sys.modules makes `import module` raise ImportError: the package is absent.
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    if sink == "tensorboard":
        monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    cfg = apply_overrides(PipelineConfig(), [f'log.sinks=["{sink}"]'])
    run = RunDir.create(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"pip install 'opdflow\[{sink}\]'"):
        open_trackers(cfg, run)


def test_cli_log_flag_reaches_the_config():
    from click.testing import CliRunner

    from opdflow.cli import main

    res = CliRunner().invoke(
        main, ["validate", "pipelines/tiny_cpu.py", "--set", 'log.sinks=["wandb","mlflow"]']
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["log"]["sinks"] == ["wandb", "mlflow"]
    res = CliRunner().invoke(main, ["run", "pipelines/tiny_cpu.py", "--log", "wandb,nope"])
    assert res.exit_code == 2
    assert "log.sinks[1] = 'nope'" in res.output
