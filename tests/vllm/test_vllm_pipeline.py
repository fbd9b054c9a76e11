"""vLLM inside Ray actors, as a run uses it: the tiny pipeline end to end with engine.kind =
"vllm" (generator replicas and the evaluator's held-out generation on BF16 vLLM engines),
and a tensor-parallel replica (vLLM's multiprocessing workers, spawned, one per rank: 2 CPU
ranks of the CPU build) taking versions through the object store (one shared copy for its
workers) and through collective pairs (one per worker)."""

from __future__ import annotations

import math
import os

import pytest
import ray

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.core.mismatch import exact_kl
from opdflow.engines.base import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def cluster():
    from opdflow.cluster.connection import connect

    started = connect(4)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def weights(cluster, tiny):
    from opdflow.inputs.models import load_model
    from opdflow.weights.transport import put_version
    from opdflow.weights.version import pack

    return {  # each ref resolves to the version's handle, as the learner publishes it
        name: put_version(pack(load_model(str(path), "bfloat16").state_dict(), version))
        for name, path, version in (("student", tiny.student, 0), ("teacher", tiny.teacher, 1))
    }


@pytest.mark.slow
def test_tiny_pipeline_runs_with_the_vllm_engine(tmp_path, cluster, weights, tiny, tokenizer):
    from opdflow.driver.controller import run_pipeline
    from opdflow.record.rundir import RunDir, read_table
    from opdflow.stages.evaluator import Evaluator

    steps, prompts = 4, 64
    cfg = apply_overrides(
        PipelineConfig(name="vllm"),
        ["engine.kind=vllm", f"train.steps={steps}", f"eval.every={steps}",
         f"eval.prompts={prompts}"],
    )  # fmt: skip
    run = RunDir.create(cfg, tmp_path / "run")
    seen = {}

    def on_start(st):
        """Before the run: held-out generation is on vLLM, and at the teacher's weights both
        its sampler and the BF16 student that scores move (held-out KL ~ 0)."""
        seen["kind"] = ray.get(st.evaluator.engine_kind.remote())
        h, e = st.heldout_set, cfg.eval
        args = (h.token_ids, h.answers, e.samples_per_prompt, cfg.engine.max_new_tokens, e.seed)
        seen["teacher"] = ray.get(st.evaluator.heldout.remote(weights["teacher"], *args))
        seen["args"] = args

    summary = run_pipeline(cfg, run, on_start=on_start)
    metrics = read_table(run.path / "metrics.parquet")
    assert [r["step"] for r in metrics] == list(range(steps))
    assert all(0 <= r["step"] - r["version"] <= cfg.staleness.k for r in metrics)
    assert max(r["version"] for r in metrics) >= 1  # the engine followed weight updates
    # the vLLM bf16 engine's mismatch against the BF16 rescorer is small, exact KL included
    assert math.isfinite(summary["d_engine_exact"]) and 0 <= summary["d_engine_exact"] < 1e-3
    assert abs(summary["d_engine_k1"]) < 5e-3
    assert (run.path / "final" / "model.safetensors").is_file()
    assert seen["kind"] == "vllm"
    on_vllm = summary["heldout_kl_start"]  # version 0, after the evaluator went back to it
    assert seen["teacher"]["kl"] < 1e-3 < on_vllm
    assert seen["teacher"]["accuracy"] > summary["heldout_accuracy_start"] + 0.3
    # the same metric from TorchEngine's sampler: equal up to sampling noise (256 responses)
    on_torch = Evaluator(str(tiny.student), str(tiny.teacher), str(tiny.tokenizer))
    torch_kl = on_torch.heldout(*seen["args"])["kl"]
    print(f"held-out KL at the student: vLLM evaluator {on_vllm:.4f}, TorchEngine {torch_kl:.4f}"
          f"; at the teacher's weights (vLLM) {seen['teacher']['kl']:.2e}")  # fmt: skip
    assert 0.7 < on_vllm / torch_kl < 1.4


def _tp2_worker(tiny, tokenizer):
    """A generator replica of the tiny student on vLLM with tensor_parallel_size=2."""
    from opdflow.stages.generator import GeneratorWorker
    from opdflow.stages.specs import GeneratorSpec

    spec = GeneratorSpec(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id,
                         "vllm", tensor_parallel_size=2)  # fmt: skip
    return ray.remote(GeneratorWorker).options(num_cpus=0).remote(spec)


def test_a_tensor_parallel_replica_samples_and_follows_weight_updates(
    cluster, weights, tiny, tokenizer, prompts
):
    from test_vllm_engine import _rescore

    worker = _tp2_worker(tiny, tokenizer)
    try:
        params = SamplingParams(return_logdist=True)
        kls = {}
        for name, version in (("student", 0), ("teacher", 1)):
            req = GenerationRequest(prompts[:16], list(range(16)), [None] * 16, 4, 3, version,
                                    params)  # fmt: skip
            batch = ray.get(worker.generate.remote(req, weights[name], version), timeout=600)
            assert batch.version == version and batch.num_tokens > 50
            mask = batch.response_mask_B_T
            for model in ("student", "teacher"):
                _, dist = _rescore(getattr(tiny, model), batch, params)
                kls[name, model] = exact_kl(batch.logdist_engine_B_T_V, dist, mask)
        print("TP=2 exact KL, (engine weights, rescored by):", kls)
        assert kls["student", "student"] < 1e-3 and kls["teacher", "teacher"] < 5e-3
        assert kls["teacher", "student"] > 20 * kls["teacher", "teacher"]  # it moved
        # the object-store version reached the two spawned workers through one shared copy,
        # whose file is gone once they mapped it (nothing left if the actor is killed)
        shared = ray.get(worker.__ray_call__.remote(
            lambda actor: (actor.engine._segment.nbytes, os.path.exists(actor.engine._segment.path))
        ))  # fmt: skip
        assert shared == (weights["teacher"].nbytes, False)
    finally:
        ray.kill(worker)


def test_a_tensor_parallel_replica_takes_collective_versions_on_a_pair_per_worker(
    cluster, tiny, tokenizer, prompts
):
    """weights.transport = "collective" into a TP=2 replica: each spawned worker joins its own
    gloo pair with the learner and reloads its shard from the buckets it receives; one send
    call fills each bucket once for both. The learner here holds the teacher's weights as
    version 1, so the engine's samples move to the teacher's distribution."""
    from test_vllm_engine import _rescore

    from opdflow.config import TrainConfig
    from opdflow.stages.learner_actor import learner_class
    from opdflow.stages.specs import LearnerSpec
    from opdflow.weights.transport import Collective

    bucket = 2**16
    learner = learner_class().options(num_cpus=0).remote(
        LearnerSpec(str(tiny.teacher), TrainConfig(),
                    transport=Collective(bucket_bytes=bucket, timeout_s=300))
    )  # fmt: skip
    worker = _tp2_worker(tiny, tokenizer)
    try:

        def at_version_1(actor):
            actor.learner.version = 1

        ray.get(learner.__ray_call__.remote(at_version_1))
        weights = ray.get(learner.publish.remote())
        assert weights.version == 1 and weights.nbytes > 8 * bucket
        params = SamplingParams(return_logdist=True)
        req = GenerationRequest(prompts[:16], list(range(16)), [None] * 16, 4, 3, 1, params)
        batch = ray.get(worker.generate.remote(req, weights, 1), timeout=600)
        assert batch.version == 1 and batch.num_tokens > 50
        _, dist = _rescore(tiny.teacher, batch, params)
        kl = exact_kl(batch.logdist_engine_B_T_V, dist, batch.response_mask_B_T)
        print(f"TP=2 over collective pairs: exact KL to the teacher {kl:.2e}")
        assert kl < 5e-3
        pairs = ray.get(learner.__ray_call__.remote(lambda actor: len(actor.publisher._pairs)))
        assert pairs == 2  # one per tensor-parallel worker
        assert ray.get(worker.transport_used.remote()) == "collective"
    finally:
        ray.kill(worker)
        ray.kill(learner)
