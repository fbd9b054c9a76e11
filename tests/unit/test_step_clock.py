import math
import time

from opdflow.controller import StepClock


def test_updates_per_hour_counts_steps_after_warmup_only():
    clock = StepClock(first_step=0, warmup=2)
    results = []
    for done in range(1, 6):
        time.sleep(0.01)
        results.append(clock.tick(done))
    assert math.isnan(results[0][1])
    assert math.isnan(results[1][1])  # warm-up ends here: the clock starts
    step_s, uph, elapsed = results[-1]
    assert step_s > 0
    assert elapsed >= sum(r[0] for r in results) - 1e-9
    assert 0 < uph < 3600 / 0.01  # 3 timed steps of >= 10 ms each


def test_no_warmup_and_resumed_runs():
    clock = StepClock(first_step=10, warmup=0)
    time.sleep(0.01)
    _, uph, _ = clock.tick(11)
    assert math.isfinite(uph)
    assert uph > 0
