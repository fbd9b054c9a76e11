"""The simulator against cases with known answers, and its policies are the real ones."""

from dataclasses import replace

import numpy as np
import pytest

from opdflow.analysis.lengths import LengthModel
from opdflow.analysis.simulator import SimConfig, grid, simulate, smallest_saturated
from opdflow.analysis.stage_times import StageTimes
from opdflow.core.adaptive import AdaptiveStaleness
from opdflow.core.launch import replay
from opdflow.core.policy import make_policy
from opdflow.core.staleness import FixedStaleness, within_bound
from opdflow.errors import ConfigError


def _period(result, n: int = 10) -> float:
    """Mean step period in the steady state (from the middle: no fill, no drain)."""
    mid = len(result.schedule) // 2
    ends = [s.train_end_s for s in result.schedule[mid : mid + n]]
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def _noisy_times(seed: int = 0) -> StageTimes:
    rng = np.random.default_rng(seed)
    base = StageTimes.constant(gen_s=1.0, train_s=0.6, rescore_s=0.1, teacher_s=0.1,
                               publish_s=0.02, fetch_s=0.01, overhead_s=0.01,
                               prompts_per_step=4, responses_per_prompt=2, length=10)  # fmt: skip

    def spread(a: np.ndarray) -> np.ndarray:
        return a[0] * rng.lognormal(0.0, 0.5, 64)

    return replace(
        base,
        gen_chunk_s=spread(base.gen_chunk_s),
        gen_chunk_responses=np.full(64, 8.0),
        response_lengths=rng.integers(2, 20, 64).astype(float),
        learner_s_per_token=spread(base.learner_s_per_token),
        rescorer_s_per_token=spread(base.rescorer_s_per_token),
    )


def test_synchronous_step_period_is_generation_plus_training():
    times = StageTimes.constant(gen_s=1.0, train_s=0.5)
    r = simulate(times, SimConfig(generators=1, k=0, steps=30))
    assert _period(r) == pytest.approx(1.5)
    assert r.updates_per_hour == pytest.approx(3600 / 1.5)
    assert r.trainer_wait_share == pytest.approx(1.0 / 1.5)
    assert r.mean_staleness == 0


def test_scorer_speedup_divides_rescoring_and_teacher_time():
    times = StageTimes.constant(gen_s=1.0, train_s=0.5, rescore_s=0.4, teacher_s=0.4)
    assert _period(simulate(times, SimConfig(k=0, steps=30))) == pytest.approx(2.3)
    fast = simulate(times, SimConfig(k=0, steps=30, scorer_speedup=4.0))
    assert _period(fast) == pytest.approx(1.0 + 0.1 + 0.1 + 0.5)


@pytest.mark.parametrize(("g", "t"), [(1.0, 0.5), (0.5, 1.0), (1.0, 1.0)])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_async_step_period_is_the_slower_stage(g, t, k):
    times = StageTimes.constant(gen_s=g, train_s=t, publish_s=0.01)
    r = simulate(times, SimConfig(generators=1, k=k, steps=40))
    assert _period(r) == pytest.approx(max(g, t + 0.01), abs=0.02)
    if t > g:  # training-bound: the trainer never waits once the pipeline is full
        assert all(s.wait_s == 0 for s in r.schedule[k + 1 :])


def test_shared_cores_slow_overlapping_stages():
    times = StageTimes.constant(gen_s=1.0, train_s=0.5)
    one = simulate(times, SimConfig(k=1, steps=40, cores=1))
    two = simulate(times, SimConfig(k=1, steps=40, cores=2))
    assert _period(one) == pytest.approx(1.5)  # one core: overlap buys nothing
    assert _period(two) == pytest.approx(1.0)  # generation and training on their own cores
    sync = simulate(times, SimConfig(k=0, steps=40, cores=1))
    assert _period(sync) == pytest.approx(1.5)  # nothing overlaps at k = 0


def test_more_generators_shorten_a_generation_bound_step():
    times = StageTimes.constant(gen_s=2.0, train_s=0.5, prompts_per_step=8)
    periods = [_period(simulate(times, SimConfig(generators=n, k=0, steps=20))) for n in (1, 2, 4)]
    assert periods[0] > periods[1] > periods[2]
    assert periods[2] == pytest.approx(2.0 / 4 + 0.5)


def test_generators_beyond_the_prompts_do_not_help():
    times = StageTimes.constant(gen_s=2.0, train_s=0.5, prompts_per_step=2)
    p2, p8 = (_period(simulate(times, SimConfig(generators=n, k=0, steps=20))) for n in (2, 8))
    assert p2 == pytest.approx(p8)


@pytest.mark.parametrize("k", [0, 1, 2, 4, "adaptive"])
@pytest.mark.parametrize("generators", [1, 3])
def test_every_step_is_trained_once_within_the_bound(k, generators):
    r = simulate(_noisy_times(), SimConfig(generators=generators, k=k, k_max=4, steps=80))
    assert [s.step for s in r.schedule] == list(range(80))
    for s in r.schedule:
        assert within_bound(s.step, s.version, s.k)
        assert s.train_start_s >= s.ready_s - 1e-9
        assert s.ready_s >= s.launched_s
    starts = [s.train_start_s for s in r.schedule]
    assert starts == sorted(starts)


def test_adaptive_runs_the_real_policy_and_hides_generation():
    times = StageTimes.constant(gen_s=1.0, train_s=0.5)
    adaptive = simulate(times, SimConfig(generators=1, k="adaptive", k_max=4, steps=120))
    sync = simulate(times, SimConfig(generators=1, k=0, steps=120))
    assert type(adaptive.policy) is AdaptiveStaleness
    assert type(sync.policy) is FixedStaleness
    assert adaptive.decisions and adaptive.decisions[0].new_k > 0
    assert adaptive.k_final >= 1
    assert adaptive.updates_per_hour > 1.3 * sync.updates_per_hour


def test_the_simulator_trains_what_the_controllers_launch_rule_says():
    """The schedule is core/launch.py's rule, which the controller drives: a fresh policy fed
    the simulated steps' observations trains every step at the simulated version, with the
    same k in effect and the same batches dropped."""
    cfg = SimConfig(generators=3, k="adaptive", k_max=4, steps=300)
    r = simulate(_noisy_times(), cfg)
    assert any(d.new_k < d.old_k for d in r.decisions) and r.dropped > 0  # k lowered: drops
    trained = replay(make_policy(cfg.staleness), r.observations)
    assert [t.step for t in trained] == [s.step for s in r.schedule]
    assert [t.version for t in trained] == [s.version for s in r.schedule]
    assert [t.k for t in trained[:-1]] == [s.k for s in r.schedule[1:]]  # k after step s
    assert trained[-1].dropped == r.dropped


def test_longer_responses_slow_the_synchronous_step():
    times = _noisy_times()
    short = simulate(times, SimConfig(k=0, steps=60))
    long = simulate(times, SimConfig(k=0, steps=60, response_length_scale=2.0))
    fast_learner = simulate(times, SimConfig(k=0, steps=60, learner_speedup=4.0))
    fast_scorers = simulate(times, SimConfig(k=0, steps=60, scorer_speedup=4.0))
    assert long.updates_per_hour < 0.8 * short.updates_per_hour
    assert fast_learner.updates_per_hour > short.updates_per_hour
    assert fast_scorers.updates_per_hour > short.updates_per_hour


def test_a_heavy_tail_keeps_the_mean_and_makes_chunks_wait_for_their_longest():
    times = replace(_noisy_times(), max_new_tokens=1000)
    heavy = LengthModel.parse("pareto:1.3:1000", times)
    light = LengthModel.parse("pareto:6:1000", times)
    mean = float(np.mean(times.response_lengths))
    assert np.mean(light.samples) == pytest.approx(mean, rel=0.1)
    assert heavy.expected_longest(64) > 2 * light.expected_longest(64)
    assert heavy.expected_longest(64) > heavy.expected_longest(8)
    with pytest.raises(ConfigError, match="pareto:ALPHA"):
        LengthModel.parse("pareto:0.5", times)


def test_a_heavy_tail_makes_asynchrony_pay_more():
    noisy = _noisy_times()  # generation fast next to training: asynchrony can hide its tail
    times = replace(noisy, gen_chunk_s=noisy.gen_chunk_s * 0.2, max_new_tokens=400)

    def uph(tail: str, k: int, generators: int = 1) -> float:
        cfg = SimConfig(k=k, steps=150, tail=tail, generators=generators)
        return simulate(times, cfg).updates_per_hour

    heavy = "pareto:1.5:400"
    assert uph(heavy, 0) < 0.95 * uph("empirical", 0)  # the longest response holds the chunk
    assert uph(heavy, 2) / uph(heavy, 0) > uph("empirical", 2) / uph("empirical", 0)
    assert uph(heavy, 0, generators=4) > uph(heavy, 0)


def test_smallest_saturated_configuration():
    times = StageTimes.constant(gen_s=2.0, train_s=0.5, prompts_per_step=8)
    results = grid(times, [1, 2, 4, 8], [0, 1, 2, 4], SimConfig(steps=60), replicates=1)
    best = smallest_saturated(results)
    assert best is not None and best.trainer_wait_share <= 0.02
    # with G replicas a chunk takes 2/G s: hidden once 2/G <= 0.5 (G = 4) at k >= 1
    assert (best.config.generators, best.config.k) == (4, 1)


def test_bad_configurations_name_the_field():
    with pytest.raises(ConfigError, match="generators"):
        SimConfig(generators=0).validate()
    with pytest.raises(ConfigError, match="learner_speedup"):
        SimConfig(learner_speedup=0).validate()
    with pytest.raises(ConfigError, match="scorer_speedup"):
        SimConfig(scorer_speedup=0).validate()
