"""The run lifecycle outside the training loop: the CPUs a run holds, and what a Session
refuses, reuses or leaves behind before it trains (no Ray is started by these tests)."""

import json

import pytest

from opdflow.cluster.placement import cpu_need
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.session import Session
from opdflow.errors import ConfigError


def _cfg(*overrides: str) -> PipelineConfig:
    return apply_overrides(PipelineConfig(name="s"), list(overrides))


def test_cpu_need_counts_every_replica_the_pool_may_grow_to_and_every_learner_worker():
    cpus = ["resources.generator.num_cpus=2", "resources.learner.num_cpus=3"]
    base = cpu_need(_cfg(*cpus))
    r = _cfg(*cpus).resources
    others = sum(s.num_cpus for s in (r.rescorer, r.teacher, r.evaluator))
    assert base == r.generator.num_cpus + r.learner.num_cpus + others
    grown = cpu_need(_cfg(*cpus, "engine.max_replicas=4"))
    assert grown - base == 3 * r.generator.num_cpus  # three replicas beyond the first
    workers = cpu_need(_cfg(*cpus, "resources.learner.workers=2"))
    assert workers - base == r.learner.num_cpus  # a second learner worker
    more = cpu_need(_cfg(*cpus, "engine.replicas=2", "engine.max_replicas=2"))
    assert more - base == r.generator.num_cpus


def _finished(path, cfg, summary):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "events.jsonl").write_text(json.dumps({"event": "finished", "seconds": 12.5}) + "\n")


def test_a_finished_run_of_the_same_config_is_reused_untouched_without_ray(tmp_path):
    cfg, path = _cfg("train.steps=3"), tmp_path / "run"
    _finished(path, cfg, {"steps": 3})
    before = sorted((p.name, p.read_bytes()) for p in path.iterdir())
    with Session() as session:
        out = session.run(cfg, path, reuse=True)
        assert not session.connected
    assert out.reused and out.summary == {"steps": 3} and out.seconds == 12.5
    assert out.run.path == path
    assert sorted((p.name, p.read_bytes()) for p in path.iterdir()) == before


@pytest.mark.parametrize("finished", [True, False])
def test_a_run_of_another_config_is_refused_and_left_as_it_is(tmp_path, finished):
    path = tmp_path / "run"
    if finished:
        _finished(path, _cfg("train.lr=1e-3"), {"steps": 3})
    else:
        path.mkdir()
        (path / "config.json").write_text(json.dumps(_cfg("train.lr=1e-3").to_dict()))
    before = sorted((p.name, p.read_bytes()) for p in path.iterdir())
    session = Session()
    with pytest.raises(ConfigError, match="another config"):
        session.run(_cfg(), path, reuse=True)
    assert not session.connected
    assert sorted((p.name, p.read_bytes()) for p in path.iterdir()) == before


def test_a_new_run_refuses_a_directory_that_is_not_empty_before_reading_anything(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    (path / "metrics.parquet").write_text("precious")
    session = Session()
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        session.run(_cfg(), path)
    assert not session.connected and (path / "metrics.parquet").read_text() == "precious"


def test_bad_input_leaves_no_run_directory_and_starts_no_ray(tmp_path, tiny):
    missing = tmp_path / "missing.parquet"
    session = Session()
    with pytest.raises(ConfigError, match=r"missing\.parquet"):
        session.run(_cfg(f"data.train={missing}"), tmp_path / "run")
    assert not session.connected and not (tmp_path / "run").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(_cfg().to_dict()))
    with pytest.raises(ConfigError, match=r"--resume .*no complete checkpoint"):
        session.run(_cfg(), resume=tmp_path / "old")
    assert not session.connected
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["config.json"]
