"""weights.transport = "collective" over gloo: a short synchronous demo run (in buckets of
1 MiB: a tiny model's version is a few of them) whose generator loads, byte for byte, the
BF16 weights the object-store path publishes, and whose metrics equal the object-store
run's (the shared k = 0 run) step for step."""

import json

import ray

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table

STEPS = 4
SAME = (
    "loss", "train_kl", "grad_norm", "entropy", "tokens", "responses", "response_len",
    "train_reward", "d_engine_k1", "d_engine_k3", "d_engine_exact", "d_stale_k1", "d_stale_k3",
    "d_total_k1", "d_total_k3", "version", "staleness", "skipped", "micro_batches",
)  # fmt: skip


def _digests():
    """Functions run on actors by __ray_call__ (nested: pickled by value, this test module
    is not importable in the workers): (version, sha256 of BF16 bytes)."""

    def _engine_bits(actor):
        """(version, BF16 bytes) of a generator's engine model: what it loaded."""
        import hashlib

        import torch

        h = hashlib.sha256()
        for t in actor.engine.model.state_dict().values():
            h.update(t.detach().to(torch.bfloat16).view(torch.int16).numpy().tobytes())
        return actor.engine.version, h.hexdigest()

    def _published_bits(actor):
        """(version, BF16 bytes) the object-store path publishes: the learner's cast into a
        host buffer (Learner.bf16_weights, the buffer a put would take)."""
        import hashlib

        import torch

        from opdflow.weights.version import views

        h = hashlib.sha256()
        for t in views(actor.learner.bf16_weights()).values():
            h.update(t.view(torch.int16).numpy().tobytes())
        return actor.learner.version, h.hexdigest()

    return _engine_bits, _published_bits


def test_collective_over_gloo_loads_the_published_bytes_and_trains_like_the_object_store(
    tmp_path, ray_local, tiny, k0_run
):
    cfg = apply_overrides(
        PipelineConfig(name="t0"),
        ["staleness.k=0", f"train.steps={STEPS}", f"eval.every={STEPS}",
         "weights.transport=collective", "weights.bucket_mb=1"],
    )  # fmt: skip
    stages, seen, held = {}, [], []
    engine_bits, published_bits = _digests()

    def on_step(row):
        st = stages["st"]
        seen.append(
            ray.get([st.pool.workers[0].__ray_call__.remote(engine_bits),
                     st.learner.__ray_call__.remote(published_bits)])
        )  # fmt: skip
        held.append(ray.get(st.learner.held.remote()))

    run = RunDir.create(cfg, tmp_path / "collective")
    run_pipeline(cfg, run, on_step=on_step, on_start=lambda st: stages.update(st=st))
    metrics = read_table(run.path / "metrics.parquet")

    # the generator holds, bit for bit, what the object-store path would have published
    same_version = [(g, p) for g, p in seen if g[0] == p[0]]
    assert len(same_version) >= STEPS - 1, seen
    assert all(g[1] == p[1] for g, p in same_version), seen
    # and the run trains exactly as the object-store run does at k = 0
    _, k0_metrics, _ = k0_run
    assert [r["step"] for r in metrics] == list(range(STEPS))
    for a, b in zip(metrics, k0_metrics[:STEPS]):
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    # the run's events say how weights moved
    events = [json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()]
    moved = next(e for e in events if e["event"] == "weights")
    assert moved["transport"] == "collective"
    assert moved["generator"] == moved["rescorer"] == moved["evaluator"] == "collective/gloo"
    # the bound: k + 2 live versions; the learner holds those (and, until the evaluator has
    # loaded it, a version under evaluation), never more; weight_bytes_live is what it holds
    assert max(r["live_weight_versions"] for r in metrics) <= 2
    assert all(len(h["versions"]) <= 3 for h in held), held
    version_bytes = held[-1]["bytes"] // len(held[-1]["versions"])
    assert all(0 < r["weight_bytes_live"] <= 3 * version_bytes for r in metrics)
