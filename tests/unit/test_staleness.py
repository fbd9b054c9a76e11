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


# ---------------------------------------------------------------- the policy and the launch rule


def test_the_policy_a_config_names_answers_k_k_max_and_live_versions():
    from opdflow.config import StalenessConfig
    from opdflow.core.adaptive import AdaptiveStaleness
    from opdflow.core.policy import make_policy

    fixed = make_policy(StalenessConfig(k=2))
    assert type(fixed) is FixedStaleness
    assert (fixed.k, fixed.k_max, fixed.live_versions) == (2, 2, 4)
    adaptive = make_policy(StalenessConfig(policy="adaptive", k=1, k_max=8, budget_nats=0.1))
    assert type(adaptive) is AdaptiveStaleness
    assert (adaptive.k, adaptive.k_max, adaptive.live_versions) == (1, 8, 10)
    assert adaptive.budget == 0.1
    assert make_policy(StalenessConfig(policy="adaptive", k=0, k_max=8)).live_versions == 10


def test_a_sweep_token_sets_the_config_it_stands_for():
    from opdflow.config import StalenessConfig
    from opdflow.core.policy import k_label, settings_for, sweep_k_max, token_of

    tokens = [0, 4, 2, "adaptive"]
    assert sweep_k_max(tokens, default=8) == 4
    assert sweep_k_max(["adaptive"], default=8) == 8
    base = StalenessConfig(target_wait_share=0.05)
    a = settings_for("adaptive", base, k_max=4)
    assert (a.policy, a.k, a.k_max, a.target_wait_share) == ("adaptive", 0, 4, 0.05)
    f = settings_for(2, a, k_max=4)
    assert (f.policy, f.k) == ("fixed", 2)
    assert base.policy == "fixed" and base.k == 2  # base itself is left as it was
    assert [token_of(s.policy, s.k) for s in (a, f)] == ["adaptive", 2]
    assert [k_label(t) for t in tokens] == ["k=0", "k=4", "k=2", "adaptive"]


def test_launches_start_each_step_once_and_drop_batches_outside_the_bound():
    from opdflow.core.launch import Launches

    policy = FixedStaleness(2)
    gate = Launches(policy, steps=6)
    assert gate.due(latest=0) == [(0, 0), (1, 0), (2, 0)]
    assert gate.due(latest=0) == []  # each step once
    assert gate.due(latest=1) == [(3, 1)]
    assert gate.admit(3, 1) and gate.dropped == 0
    policy.load_state({"k": 0})  # k lowered after step 3 was launched at version 1
    assert not gate.admit(3, 1) and gate.dropped == 1
    assert gate.admit(3, 3)
    assert gate.due(latest=3) == []  # k = 0: step 4 needs version 4
    assert gate.due(latest=5) == [(4, 4), (5, 5)]  # never a version from the future
    assert gate.due(latest=9) == []  # nothing past the last step


def test_replay_of_a_fixed_bound_trains_version_step_minus_k():
    from opdflow.core.launch import replay
    from opdflow.core.staleness import StepObservation

    obs = [StepObservation(s, 0.0, 1.0, 0.0, min(s, 2)) for s in range(8)]
    trained = replay(FixedStaleness(2), obs)
    assert [t.version for t in trained] == [max(0, s - 2) for s in range(8)]
    assert all(t.k == 2 and t.dropped == 0 for t in trained)
