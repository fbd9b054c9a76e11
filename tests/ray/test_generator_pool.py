"""The generator pool grows and shrinks between min and max replicas, losing nothing.

A normal local Ray cluster with a custom `rollout` resource for 2 replicas: a third
replica stays pending (on a real cluster, the request the autoscaler acts on). The
autoscaler itself is exercised in test_autoscaling.py.
"""

from __future__ import annotations

import pytest
import ray
from support.waiting import wait_until

from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.stages.generator import GeneratorPool, GeneratorWorker
from opdflow.stages.specs import GeneratorSpec


@pytest.fixture(scope="module")
def rollout_cluster():
    from opdflow.cluster.connection import QUIET_ENV

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        resources={"rollout": 2},
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        runtime_env={"env_vars": QUIET_ENV},
        configure_logging=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def make_worker(rollout_cluster, tiny, tokenizer):
    def make():
        return (
            ray.remote(GeneratorWorker)
            .options(num_cpus=0, resources={"rollout": 1})
            .remote(
                GeneratorSpec(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id)
            )
        )

    return make


@pytest.fixture(scope="module")
def weights(rollout_cluster, tiny):
    from opdflow.inputs.models import load_model
    from opdflow.weights.transport import put_version
    from opdflow.weights.version import pack

    return put_version(pack(load_model(str(tiny.student), "bfloat16").state_dict(), 0))


@pytest.fixture
def pools():
    """Pools a test made; their replicas are killed afterwards, even when the test failed
    (a failed test's traceback would otherwise keep them holding the rollout resource)."""
    made: list[GeneratorPool] = []
    yield made
    for pool in made:
        for handle in pool.workers:
            ray.kill(handle)


def _refs(links):
    return [link.ref for link in links]


def _each(pool, requests, weights):
    """Submit each request as a step of its own (one call each): queued work."""
    return [link.ref for req in requests for link in pool.submit([req], weights)]


def _requests(tokenizer, count, version=0, max_new_tokens=8):
    ids = tokenizer.encode("Q:123+045=")
    return [
        GenerationRequest(
            [ids] * 4, [i] * 4, [None] * 4, 4, seed=i, version=version,
            params=SamplingParams(max_new_tokens=max_new_tokens),
        )
        for i in range(count)
    ]  # fmt: skip


def _wait_ready(pool, n):
    wait_until(lambda: pool.status()["ready"] >= n, 300, pool.status)


def test_grows_under_queued_work_and_shrinks_when_idle(make_worker, weights, tokenizer, pools):
    pool = GeneratorPool(
        [make_worker()], make_worker, 1, 3, idle_grace_s=1.0, pending_timeout_s=1.0
    )
    pools.append(pool)
    _wait_ready(pool, 1)
    assert pool.rescale() == []  # nothing queued: no change
    refs = _each(pool, _requests(tokenizer, 6), weights)
    events = pool.rescale()
    assert [e["action"] for e in events] == ["add"]
    assert events[0]["pending"] == 1  # one pending at a time: test_one_replica_pending_at_a_time
    _wait_ready(pool, 2)
    new = pool.replicas[1]
    refs += _each(pool, _requests(tokenizer, 6), weights)
    assert new.inflight  # the new replica takes work once ready
    assert [e["action"] for e in pool.rescale()] == ["add"]  # a third: no rollout left
    third = pool.replicas[2]
    refs += _each(pool, _requests(tokenizer, 4), weights)
    assert not third.inflight  # a pending replica gets no work
    batches = ray.get(refs)  # nothing lost
    assert len(batches) == 16 and all(b.num_responses == 16 for b in batches)
    assert pool.status() == {"ready": 2, "pending": 1, "retiring": 0, "queued": 0}
    events = []

    def back_to_min() -> bool:  # idle: back to min, one replica per grace period
        events.extend(pool.rescale())
        return len(pool.replicas) == 1

    wait_until(back_to_min, 120, lambda: events, poll_s=0.3)
    retires = [e for e in events if e["action"] == "retire"]
    assert len(retires) == 2 and sum(e["action"] == "removed" for e in events) == 2, events
    assert "not ready" in retires[0]["reason"]  # the never-placed one goes first
    assert "utilisation" in retires[1]["reason"]
    assert pool.status() == {"ready": 1, "pending": 0, "retiring": 0, "queued": 0}


def test_one_replica_pending_at_a_time(make_worker, weights, tokenizer, pools):
    """While an added replica is pending no second one is added, however much is asked for:
    with both `rollout` units held, the third replica can never be placed, so it stays
    pending for the whole test (no timing involved)."""
    pool = GeneratorPool([make_worker(), make_worker()], make_worker, 2, 4, idle_grace_s=60)
    pools.append(pool)
    _wait_ready(pool, 2)
    assert [e["action"] for e in pool.rescale(want_more=True)] == ["add"]
    refs = _each(pool, _requests(tokenizer, 6), weights)  # queued work beyond the ready two
    for _ in range(3):  # the scheduler asks, and work is queued: still only the one pending
        assert pool.rescale(want_more=True) == []
    status = pool.status()
    assert (status["ready"], status["pending"], status["retiring"]) == (2, 1, 0), status
    assert not pool.replicas[2].inflight  # and it gets no work
    ray.get(refs)


def test_a_retiring_replica_finishes_its_work(make_worker, weights, tokenizer, pools):
    pool = GeneratorPool([make_worker(), make_worker()], make_worker, 1, 2, idle_grace_s=60)
    pools.append(pool)
    _wait_ready(pool, 2)
    refs = _each(pool, _requests(tokenizer, 6, max_new_tokens=16), weights)
    busy = [r for r in pool.replicas if r.inflight]
    assert len(busy) == 2
    pool.max_replicas = 1
    events = pool.rescale()
    assert [e["action"] for e in events] == ["retire"]
    retiring = next(r for r in pool.replicas if r.retiring)
    more = _refs(pool.submit(_requests(tokenizer, 2), weights))  # one step: merged, one call
    assert len(more) == 1 and all(ref not in retiring.inflight for ref in more)
    batches = ray.get(refs + more)  # its in-flight work completed
    assert [b.num_responses for b in batches] == [16] * 6 + [32]
    assert [e["action"] for e in pool.rescale()] == ["removed"]
    assert len(pool.replicas) == 1


def test_new_replica_fetches_the_current_version(make_worker, tiny, tokenizer, pools):
    from opdflow.inputs.models import load_model
    from opdflow.weights.transport import put_version
    from opdflow.weights.version import pack

    pool = GeneratorPool([make_worker()], make_worker, 1, 2, idle_grace_s=60)
    pools.append(pool)
    v3 = put_version(pack(load_model(str(tiny.teacher), "bfloat16").state_dict(), 3))
    pool.submit(_requests(tokenizer, 3, version=3), v3)
    _wait_ready(pool, 1)
    assert [e["action"] for e in pool.rescale(want_more=True)] == ["add"]
    assert ray.get(pool.replicas[1].ready_ref) == 3  # loaded on joining, before any work


def test_pipeline_adds_the_replica_its_scheduler_asks_for_and_trains_every_step_once(
    rollout_cluster, tiny, tmp_path
):
    """The scheduler -> pool wire, in a real run. At k = 0 the trainer waits for every step's
    generation and scoring (structurally, on any machine), so the adaptive policy pinned at
    k_max = 0 must ask for a generator replica. The pool's own queued-work growth is tested
    above without a learner, because whether one generator keeps up with the learner depends
    on the machine."""
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.driver.controller import run_pipeline
    from opdflow.record.rundir import RunDir, read_table

    steps = 12
    cfg = apply_overrides(
        PipelineConfig(name="pool"),
        [
            f"train.steps={steps}", f"eval.every={steps}", "eval.prompts=8",
            "staleness.policy=adaptive", "staleness.k=0", "staleness.k_max=0",
            "engine.min_replicas=1", "engine.max_replicas=2", "engine.scale_down_idle_s=60",
            "resources.generator.num_cpus=0", 'resources.generator.resources={"rollout": 1}',
        ],
    )  # fmt: skip
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run)
    metrics = read_table(run.path / "metrics.parquet")
    assert [r["step"] for r in metrics] == list(range(steps))
    assert [s for s, _ in summary["trained_steps_record"]] == list(range(steps))
    assert all(r["version"] == r["step"] for r in metrics)  # k = 0, with a replica joining
    import json

    events = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    asks = [e for e in events if e["event"] == "staleness" and e["want_more_generators"]]
    adds = [e for e in events if e["event"] == "generator_pool" and e["action"] == "add"]
    assert asks and "more generator replicas needed" in asks[0]["reason"], events
    assert [e["reason"] for e in adds] == ["scheduler"], events  # once: max_replicas = 2
    assert adds[0]["step"] == asks[0]["step"]
    assert {r["generator_replicas"] for r in metrics} <= {1, 2}
