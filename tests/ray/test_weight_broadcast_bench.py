"""bench/weight_broadcast.py in its CI size: every number present and sane (no timing bounds)."""

import importlib.util
import math
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "weight_broadcast.py"


def _bench():
    spec = importlib.util.spec_from_file_location("weight_broadcast", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_bench_reports_publish_fetch_and_gloo_next_to_memcpy(ray_local, capsys):
    bench = _bench()
    rows = bench.run(**bench.QUICK)
    bench.print_table(rows)
    assert [r["parts"] for r in rows] == [1, 5]  # 0.1 GB-equivalent: five 0.02 GB parts
    for r in rows:
        assert math.isclose(r["gb"], r["parts"] * r["part_gb"])
        for key in ("publish", "fetch", "coll_total"):
            assert r[f"{key}_s"] > 0 and math.isfinite(r[f"{key}_s"]), (key, r)
            assert r[f"{key}_gbps"] > 0 and r[f"{key}_over_memcpy"] > 0, (key, r)
        assert r["memcpy_s"] > 0 and r["total_over_memcpy"] > 0
        # each part was in the object store when measured; no more than what Ray holds
        assert r["part_gb"] * 0.99 <= r["plasma_peak_gb"]
        assert r["peak_rss_publisher_gb"] > r["part_gb"]  # it held the state
    out = capsys.readouterr().out
    assert "publish/mc" in out and len(out.strip().splitlines()) == 3
