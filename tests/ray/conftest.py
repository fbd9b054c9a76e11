import pytest


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster on loopback, shared by the tests of this directory."""
    import ray

    from opdflow.raycluster import connect

    connect()
    yield ray
    ray.shutdown()
