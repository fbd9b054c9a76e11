import pytest


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster on loopback, shared by the tests of this directory."""
    import ray

    from opdflow.raycluster import connect

    connect(num_cpus=4)  # logical CPUs: tests run up to 2 generators + learner at 1 CPU each
    yield ray
    ray.shutdown()
