"""VLLMEngine's throughput settings, decided per machine without importing vLLM: CUDA graphs
on GPUs and eager on the CPU build, prefix caching on, one worker per tensor-parallel GPU;
the fp8_kv amax rule keeps eager mode and no prefix cache (its scales come from each
prefill). The CPU build's side runs in tests/vllm."""

from __future__ import annotations

import pytest

from opdflow.engines.vllm_settings import context_length, cpu_thread_binding, runtime_options
from opdflow.errors import ConfigError


def test_gpu_gets_cuda_graphs_and_prefix_caching_cpu_runs_eager():
    assert runtime_options(False, 1, gpu=True) == {
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "uni",
    }
    cpu = runtime_options(False, 1, gpu=False)
    assert cpu["enforce_eager"] and cpu["enable_prefix_caching"]


def test_a_tensor_parallel_replica_gets_one_worker_per_gpu():
    o = runtime_options(False, 2, gpu=True)
    assert o["tensor_parallel_size"] == 2 and o["distributed_executor_backend"] == "mp"


def test_fp8_kv_amax_scales_keep_eager_mode_and_no_prefix_cache():
    o = runtime_options(True, 1, gpu=True)
    assert o["enforce_eager"] and not o["enable_prefix_caching"]
    with pytest.raises(ConfigError, match=r"fp8_kv\(scale=unit\)"):
        runtime_options(True, 1, gpu=True, enforce_eager=False)


def test_cpu_ranks_get_disjoint_cores(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    assert cpu_thread_binding(2) == "0,1|2,3"
    assert cpu_thread_binding(1) == "0,1,2,3,5"
    with pytest.raises(ConfigError, match=r"tensor_parallel_size = 8 .* may use 5"):
        cpu_thread_binding(8)


def test_the_engine_plans_for_the_runs_sequences_within_the_models_context():
    assert context_length(2048 + 16384, 131072) == 18432  # dapo_math on a 131k-context model
    assert context_length(520, 256) == 256 and context_length(None, 256) == 256
