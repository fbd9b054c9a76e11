"""A tensor-parallel vLLM engine's spawned workers take an object-store version through one
shared copy the engine makes (weights/segment.py), each loading only its shard: stub workers
(tests/support/tp_workers.py: spawned processes running the real WorkerExtension over a
stand-in for vLLM's reload path) get, byte for byte, their shard of the version the object
store holds; the copy is made once per version and engine, the file is gone once the
workers mapped it, and the next version reuses the same mapping."""

from __future__ import annotations

import os

import torch
from support.tp_workers import StubEngine, digest, shard_of

from opdflow.weights.segment import share
from opdflow.weights.version import pack, views


def _version(seed: int, version: int):
    torch.manual_seed(seed)
    state = {
        "embed.weight": torch.randn(64, 32, dtype=torch.bfloat16),
        "layers.0.qkv.weight": torch.randn(96, 32, dtype=torch.bfloat16),
        "layers.0.qkv.bias": torch.randn(96, dtype=torch.bfloat16),
        "norm.weight": torch.randn(33, dtype=torch.bfloat16),  # odd rows: kept whole
        "steps": torch.arange(6),
    }
    return pack(state, version)  # what the object store holds (read zero-copy by the actor)


def _expected(packed, rank: int, world: int) -> dict[str, str]:
    return digest({n: shard_of(t, rank, world) for n, t in views(packed).items()})


def test_tp_workers_load_their_shards_from_one_shared_copy_of_an_object_store_version():
    world, engine, segment = 2, StubEngine(2), None
    try:
        for version in (1, 2):
            packed = _version(version, version)
            state = views(packed)  # what the engine's actor holds: zero-copy views
            before = segment
            segment, specs = share(state, segment)
            if before is not None:
                assert segment is before and not os.path.exists(segment.path)  # reused
            got = engine.rpc("opdflow_reload_shared", segment.path, specs, segment.nbytes)
            segment.unlink()  # every worker has mapped it
            assert not os.path.exists(segment.path)
            assert got == [_expected(packed, r, world) for r in range(world)]
            assert got[0]["layers.0.qkv.weight"] != got[1]["layers.0.qkv.weight"]  # shards
            assert got[0]["norm.weight"] == got[1]["norm.weight"]
        # a state without a flat buffer (a plain dict) is laid out into the segment too
        packed = _version(3, 3)
        plain = {n: t.clone() for n, t in views(packed).items()}
        segment, specs = share(plain, segment)
        got = engine.rpc("opdflow_reload_shared", segment.path, specs, segment.nbytes)
        assert got == [_expected(packed, r, world) for r in range(world)]
    finally:
        engine.close()
