"""bench/weight_broadcast.py in its CI size: the run's own weight path with both transports,
every number present and sane, the consumer's weights equal to a plain BF16 cast of the
learner's weights its version was published from (no timing bounds)."""

import importlib.util
import json
import math
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "weight_broadcast.py"


def _bench():
    spec = importlib.util.spec_from_file_location("weight_broadcast", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_bench_times_publish_and_fetch_of_both_transports_next_to_memcpy(
    ray_local, capsys, tmp_path
):
    bench = _bench()
    results = bench.run(**bench.QUICK)
    bench.print_table(results)
    assert [r["transport"] for r in results] == ["object_store", "collective"]
    for r in results:
        assert r["bytes_equal"] is True, r  # what the generator loaded is the learner's cast
        assert math.isclose(r["gb"], bench.QUICK["gb"], rel_tol=0.01)
        for key in ("cast", "fetch_load"):
            ratio = r[f"{key}_over_memcpy"]
            assert ratio > 0 and math.isfinite(ratio), (key, r)
        # what a publish costs the next step: a difference of two step times (noise may
        # make it negative when the cast hides entirely behind the step)
        assert math.isfinite(r["publish_critical_over_memcpy"]), r
        assert len(r["rows"]) == bench.QUICK["repeats"] + 1  # a warm-up, then the timed ones
        for row in r["rows"]:
            assert row["publish_blocked_s"] > 0 and row["cast_s"] > 0 and row["fetch_load_s"] > 0
    assert results[0]["put_s"] > 0  # the object store's put ran (beside the next step)
    out = tmp_path / "bench.json"
    out.write_text(json.dumps(bench.summary(results)))
    read = json.loads(out.read_text())
    for transport in ("object_store", "collective"):
        assert {"publish_critical_over_memcpy", "fetch_load_over_memcpy"} <= read[transport].keys()
    printed = capsys.readouterr().out
    assert "publish/mc" in printed and len(printed.strip().splitlines()) == 3
