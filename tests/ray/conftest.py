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

    from opdflow.raycluster import connect

    connect(num_cpus=4)  # logical CPUs: tests run up to 2 generators + learner at 1 CPU each
    return ray
