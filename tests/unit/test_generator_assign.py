"""A generator replica gets all of a step's requests for it in one call: a step's requests
go to distinct replicas, least busy first, and a replica given several gets them merged."""

from __future__ import annotations

import pytest

from opdflow.engines.base import GenerationRequest, SamplingParams, merge_requests
from opdflow.stages.generator import GeneratorPool


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)

    def options(self, **kw):
        return self


class FakeReplica:
    """An actor handle stand-in recording the calls it gets."""

    def __init__(self):
        self.calls: list[GenerationRequest] = []
        self.ping = _Remote(lambda: object())
        self.generate_timed = _Remote(self._generate)

    def _generate(self, request, weights, step):
        self.calls.append(request)
        return object(), object()


def _requests(n: int, step: int = 5) -> list[GenerationRequest]:
    return [
        GenerationRequest([[3, 4, i]], [i], [str(i)], 8, seed=100 + i, version=step,
                          params=SamplingParams(max_new_tokens=4))
        for i in range(n)
    ]  # fmt: skip


def _pool(k: int) -> tuple[GeneratorPool, list[FakeReplica]]:
    handles = [FakeReplica() for _ in range(k)]
    pool = GeneratorPool(handles)
    for r in pool.replicas:
        r.ready = True
    return pool, handles


def test_each_replica_gets_one_call_with_all_its_requests():
    pool, handles = _pool(3)
    pool.replicas[0].inflight = {"a": 1, "b": 2}  # busy with earlier steps
    plan = pool.assign(_requests(2))  # distinct replicas, least busy first
    assert [pool.replicas.index(rep) for rep, _ in plan] == [1, 2]
    pool, handles = _pool(3)
    links = pool.submit(_requests(2), weights="w", step=5)
    assert [len(h.calls) for h in handles] == [1, 1, 0]
    assert [link.stage for link in links] == ["generator[0]", "generator[1]"]
    pool, handles = _pool(2)
    pool.submit(_requests(5), weights="w", step=5)  # more requests than replicas
    assert [len(h.calls) for h in handles] == [1, 1]
    assert [h.calls[0].prompt_index for h in handles] == [[0, 2, 4], [1, 3]]
    assert handles[0].calls[0].prompt_ids == [[3, 4, 0], [3, 4, 2], [3, 4, 4]]
    assert handles[0].calls[0].answers == ["0", "2", "4"] and handles[0].calls[0].n == 8


def test_only_one_steps_requests_merge():
    a, b = _requests(2)
    assert merge_requests([a]) is a
    with pytest.raises(ValueError, match="one step"):
        merge_requests([a, _requests(1, step=6)[0]])
    assert merge_requests([a, b]).seed == a.seed
