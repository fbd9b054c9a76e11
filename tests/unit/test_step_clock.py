"""StepClock on a clock the test drives: exact step times and updates/hour, no wall time."""

import math

from opdflow.driver.recorder import StepClock


def _clock(times):
    it = iter(times)
    return lambda: next(it)


def test_updates_per_hour_counts_steps_after_warmup_only():
    # start at t = 100, then one step every 20 ms
    clock = StepClock(first_step=0, warmup=2, clock=_clock([100.0 + 0.02 * i for i in range(6)]))
    results = [clock.tick(done) for done in range(1, 6)]
    assert math.isnan(results[0][1])
    assert math.isnan(results[1][1])  # warm-up ends here: the clock starts
    step_s, uph, elapsed = results[-1]
    assert step_s > 0
    # the driven clock's step times add up to the elapsed time exactly
    assert math.isclose(math.fsum(r[0] for r in results), elapsed)
    assert 0 < uph < 3600 / 0.01  # 3 timed steps of >= 10 ms each
    assert math.isclose(step_s, 0.02) and math.isclose(elapsed, 0.1)
    assert math.isclose(uph, 3600 * 3 / 0.06)  # 3 steps in the 60 ms after warm-up


def test_no_warmup_and_resumed_runs():
    clock = StepClock(first_step=10, warmup=0, clock=_clock([5.0, 5.5]))
    _, uph, _ = clock.tick(11)
    assert math.isfinite(uph)
    assert uph > 0
    assert math.isclose(uph, 3600 / 0.5)  # one step (11 - first_step) in 0.5 s
