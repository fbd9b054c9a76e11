import pytest

from opdflow.core.staleness import FixedStaleness, launch_version, within_bound


@pytest.mark.parametrize(
    ("step", "version", "k", "ok"),
    [
        (0, 0, 0, True),
        (3, 3, 0, True),
        (3, 2, 0, False),
        (5, 3, 2, True),
        (5, 2, 2, False),
        (2, 3, 4, False),
    ],
)
def test_within_bound(step, version, k, ok):
    assert within_bound(step, version, k) is ok


def test_launch_version_waits_for_version_step_minus_k_and_uses_the_freshest():
    assert launch_version(step=0, k=0, latest=0) == 0
    assert launch_version(step=1, k=0, latest=0) is None  # synchronous: needs version 1
    assert launch_version(step=3, k=2, latest=1) == 1
    assert launch_version(step=4, k=2, latest=1) is None
    assert launch_version(step=2, k=8, latest=1) == 1
    assert launch_version(step=1, k=2, latest=5) == 1  # never a version from the future


def test_every_launched_version_is_within_bound_for_its_step():
    for k in range(5):
        for latest in range(10):
            for step in range(12):
                v = launch_version(step, k, latest)
                if v is not None:
                    assert within_bound(step, v, k)


def test_fixed_policy():
    p = FixedStaleness(3)
    assert p.k == 3
    with pytest.raises(ValueError, match="k must be >= 0"):
        FixedStaleness(-1)
