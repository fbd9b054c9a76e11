import pytest


@pytest.fixture(scope="session")
def _ray_session():
    import ray

    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """A real local Ray cluster on loopback, shared by the tests of a module (started again
    if an earlier test shut it down)."""
    import ray

    from opdflow.cluster.connection import connect

    connect(num_cpus=4)  # logical CPUs: tests run up to 2 generators + learner at 1 CPU each
    return ray


K0_STEPS = 30


@pytest.fixture(scope="session")
def k0_run(tmp_path_factory, _ray_session, tiny):
    """A 30-step synchronous (k = 0) tiny run, shared by the tests that only read it:
    (summary, metrics rows, RunDir)."""
    from opdflow.cluster.connection import connect
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.driver.controller import run_pipeline
    from opdflow.record.rundir import RunDir, read_table

    connect(num_cpus=4)
    cfg = apply_overrides(
        PipelineConfig(name="t0"),
        ["staleness.k=0", f"train.steps={K0_STEPS}", f"eval.every={K0_STEPS}"],
    )
    run = RunDir.create(cfg, tmp_path_factory.mktemp("k0") / "k0")
    summary = run_pipeline(cfg, run)
    return summary, read_table(run.path / "metrics.parquet"), run
