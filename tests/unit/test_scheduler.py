"""The adaptive staleness policy, driven by a pure simulation of the controller's loop.

`simulate` mirrors controller.run_pipeline step by step, through the controller's launch
rule (core/launch.py): generation for step s is launched once version s - k exists, with
the freshest version, through FIFO stage servers (generator, rescorer, teacher); the
learner waits for its step's batch, drops and regenerates it when it breaks the bound,
trains, publishes, and reports to the policy.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opdflow.core.adaptive import AdaptiveStaleness
from opdflow.core.launch import Launches
from opdflow.core.staleness import (
    Decision,
    FixedStaleness,
    StalenessPolicy,
    StepObservation,
)


@dataclass
class SimResult:
    k_by_step: list[int] = field(default_factory=list)  # k in effect when the step trained
    wait_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    d_stale: list[float] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    dropped: int = 0

    @property
    def total_s(self) -> float:
        return sum(self.step_s)

    def wait_share(self, start: int = 0) -> float:
        return sum(self.wait_s[start:]) / max(sum(self.step_s[start:]), 1e-12)


def simulate(
    policy: StalenessPolicy,
    stage_s: tuple[float, ...],
    train_s: float,
    steps: int,
    d_per_staleness: float = 0.0,
    jitter: float = 0.0,
    seed: int = 0,
) -> SimResult:
    rng = random.Random(seed)

    def noisy(x: float) -> float:
        return x * (1.0 + jitter * (2 * rng.random() - 1))

    free = [0.0] * len(stage_s)  # when each stage server is next idle
    pending: dict[int, tuple[int, float]] = {}  # step -> (version, ready time)
    latest, now, prev_end = 0, 0.0, 0.0
    gate = Launches(policy, steps)
    out = SimResult()

    def launch(step: int, at: float) -> None:
        t = at
        for i, s in enumerate(stage_s):
            t = free[i] = max(t, free[i]) + noisy(s)
        pending[step] = (latest, t)

    def launch_ready(at: float) -> None:
        for step, _ in gate.due(latest):
            launch(step, at)

    launch_ready(0.0)
    for step in range(steps):
        wait = 0.0
        while True:
            version, ready = pending.pop(step)
            wait += max(0.0, ready - now)
            now = max(now, ready)
            if gate.admit(step, version):
                break
            launch(step, now)
        k_used = policy.k
        now += noisy(train_s)
        latest = step + 1
        staleness = step - version
        d = d_per_staleness * staleness
        decision = policy.observe(StepObservation(step, wait, now - prev_end, d, staleness))
        if decision is not None:
            out.decisions.append(decision)
        out.k_by_step.append(k_used)
        out.wait_s.append(wait)
        out.step_s.append(now - prev_end)
        out.staleness.append(staleness)
        out.d_stale.append(d)
        prev_end = now
        launch_ready(now)
    out.dropped = gate.dropped
    return out


def fixed_share(stage_s, train_s, k, steps=200) -> float:
    r = simulate(FixedStaleness(k), stage_s, train_s, steps)
    return r.wait_share(start=steps // 2)


timings = st.tuples(
    st.lists(st.floats(0.01, 1.0), min_size=1, max_size=3).map(tuple),
    st.floats(0.05, 1.0),
)


# ---------------------------------------------------------------- invariants


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    t=timings,
    k_max=st.integers(0, 8),
    start_k=st.integers(0, 8),
    target=st.floats(0.005, 0.3),
    budget=st.one_of(st.just(0.0), st.floats(0.001, 0.5)),
    d_per=st.floats(0.0, 0.2),
    jitter=st.floats(0.0, 0.8),
    window=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_invariants_under_random_stage_timings(
    t, k_max, start_k, target, budget, d_per, jitter, window, seed
):
    stage_s, train_s = t
    policy = AdaptiveStaleness(k_max, target, budget, start_k=start_k, window=window)
    r = simulate(policy, stage_s, train_s, 300, d_per, jitter, seed)
    # k stays in [0, k_max]; every trained batch respected the k in effect
    assert all(0 <= k <= k_max for k in r.k_by_step)
    assert all(0 <= s <= k for s, k in zip(r.staleness, r.k_by_step))
    # every decision is a real change by one step (or a budget cap, or a replica request),
    # consistent with the previous k, and carries its reason
    k = min(start_k, k_max)
    last_step = None
    for d in r.decisions:
        assert d.old_k == k and d.reason
        if d.want_more_generators:
            assert d.new_k == d.old_k
            continue
        budget_cap = "budget" in d.reason
        assert d.new_k > d.old_k or d.new_k == d.old_k - 1 or (budget_cap and d.new_k < k)
        # hysteresis: a change only after the previous one settled (k + 1 steps) and
        # max(2, window // 2) steps were measured (2 when the wait is QUICK x the target);
        # a lower k only after 4 * window steps
        if last_step is not None and not budget_cap:
            gap = 2 if d.new_k > d.old_k else 4 * window
            assert d.step - last_step >= k + 1 + gap, (d, last_step)
        last_step, k = d.step, d.new_k
    # budget: with d_stale = c * staleness, at most the first probe of a level can break it,
    # and the final k is within budget
    if budget > 0:
        assert sum(x > budget for x in r.d_stale) <= 1
        assert policy.k * d_per <= budget or policy.k == 0
    # replicas are asked for only when k cannot rise
    for d in r.decisions:
        if d.want_more_generators:
            assert d.new_k == k_max or "budget" in d.reason


@settings(max_examples=25, deadline=None)
@given(t=timings, k_max=st.integers(1, 6), seed=st.integers(0, 1000))
def test_converges_to_the_smallest_sufficient_k_in_a_stationary_regime(t, k_max, seed):
    stage_s, train_s = t
    target = 0.02
    shares = [fixed_share(stage_s, train_s, k) for k in range(k_max + 1)]
    # stay out of the ambiguous zone where a window's share is near the thresholds
    assume(all(s < target / 4 or s > 2 * target for s in shares))
    sufficient = [k for k, s in enumerate(shares) if s <= target]
    steps = 800
    policy = AdaptiveStaleness(k_max, target, start_k=seed % (k_max + 1))
    r = simulate(policy, stage_s, train_s, steps)
    tail = r.k_by_step[steps // 2 :]
    mode = max(set(tail), key=tail.count)
    if sufficient:
        assert mode == sufficient[0], (shares, r.decisions)
        # probes of a lower k die out: few changes in the second half
        assert sum(d.step >= steps // 2 for d in r.decisions) <= 4
    else:  # nothing is enough: k_max, asking for more generators
        assert mode == k_max
        assert any(d.want_more_generators for d in r.decisions)


# ---------------------------------------------------------------- examples


def test_raises_k_until_the_trainer_stops_waiting_then_holds():
    # generation chain 3 x 0.1 s, training 0.1 s: k = 3 overlaps fully
    policy = AdaptiveStaleness(k_max=8, target_wait_share=0.02)
    r = simulate(policy, (0.1, 0.1, 0.1), 0.1, 400)
    shares = [fixed_share((0.1, 0.1, 0.1), 0.1, k) for k in range(4)]
    best = min(k for k, s in enumerate(shares) if s <= 0.02)
    assert r.k_by_step[-1] == best
    assert r.decisions[0].new_k == 3 and "raise" in r.decisions[0].reason  # latency / t
    assert best == 3
    assert sum(d.step >= 200 for d in r.decisions) <= 2  # one failed probe of k = 2 at most


def test_within_five_percent_of_the_best_fixed_k():
    stage_s, train_s, steps = (0.05, 0.04, 0.03), 0.06, 600
    best = min(
        simulate(FixedStaleness(k), stage_s, train_s, steps, jitter=0.1).total_s for k in range(9)
    )
    adaptive = simulate(AdaptiveStaleness(8, 0.02), stage_s, train_s, steps, jitter=0.1)
    assert adaptive.total_s <= best / 0.95


@pytest.mark.parametrize(
    ("wait_s", "first_change"),
    [(0.4, 2), (0.06, 4)],  # share 40% (> QUICK x 2%): 2 settled steps; 6%: window // 2
)
def test_an_overwhelming_wait_raises_k_sooner(wait_s, first_change):
    policy = AdaptiveStaleness(k_max=4, target_wait_share=0.02, window=8)
    changes = [
        step
        for step in range(8)
        if policy.observe(StepObservation(step, wait_s, 1.0, float("nan"), 0))
    ]
    assert changes[0] == first_change  # k = 0 settles after 1 step, then 2 or 4 measured


def test_lowers_k_when_the_wait_is_gone():
    policy = AdaptiveStaleness(k_max=8, target_wait_share=0.02, start_k=6)
    r = simulate(policy, (0.02,), 0.1, 300)  # generation far faster than training
    assert r.k_by_step[-1] <= 1
    assert any("lower" in d.reason for d in r.decisions)


def test_asks_for_generators_at_k_max_when_generation_is_the_bottleneck():
    policy = AdaptiveStaleness(k_max=3, target_wait_share=0.02)
    r = simulate(policy, (0.3,), 0.1, 200)  # one generator 3x slower than the learner
    assert policy.k == 3
    asks = [d for d in r.decisions if d.want_more_generators]
    assert asks and "k_max=3" in asks[0].reason
    # rate-limited: at most one request per window
    steps = [d.step for d in asks]
    assert all(b - a >= policy.window for a, b in itertools.pairwise(steps))


def test_budget_caps_k_and_is_never_broken_by_a_raise():
    # d_stale 0.03 nats per version of staleness, budget 0.07: k = 2 is the most allowed
    policy = AdaptiveStaleness(k_max=8, target_wait_share=0.02, budget_nats=0.07)
    r = simulate(policy, (0.3,), 0.1, 300, d_per_staleness=0.03)
    assert max(r.k_by_step) == 2
    assert max(r.d_stale) <= 0.07
    assert any(d.want_more_generators and "budget" in d.reason for d in r.decisions)


def test_budget_exceeded_at_first_probe_drops_k_at_once():
    policy = AdaptiveStaleness(k_max=8, target_wait_share=0.02, budget_nats=0.01, start_k=1)
    r = simulate(policy, (0.3,), 0.1, 100, d_per_staleness=0.05)
    cap = next(d for d in r.decisions if "budget" in d.reason)
    assert cap.new_k == 0
    assert all(k == 0 for k in r.k_by_step[cap.step + 1 :])


def test_state_round_trip_continues_identically():
    a = AdaptiveStaleness(8, 0.02, 0.1, window=4)
    r = simulate(a, (0.1, 0.1), 0.05, 60, d_per_staleness=0.01)
    b = AdaptiveStaleness(8, 0.02, 0.1, window=4)
    b.load_state(a.state())
    obs = StepObservation(60, 0.5, 1.0, 0.01, r.staleness[-1])
    assert a.observe(obs) == b.observe(obs)
    assert a.state() == b.state()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k_max": -1}, "k_max"),
        ({"k_max": 4, "target_wait_share": 1.5}, "target_wait_share"),
        ({"k_max": 4, "budget_nats": -1.0}, "budget_nats"),
        ({"k_max": 4, "window": 0}, "window"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveStaleness(**kwargs)


def test_from_config_starts_at_k():
    from opdflow.config import StalenessConfig

    cfg = StalenessConfig(policy="adaptive", k=1, k_max=4, target_wait_share=0.05)
    p = AdaptiveStaleness.from_config(cfg)
    assert (p.k, p.k_max, p.target) == (1, 4, 0.05)
