"""Pair sends beside a data-parallel learner's own collectives: no hang, no mixed bytes.

A learner of 2 gloo ranks (FSDP2: all-gathers and reduce-scatters in its training threads,
and the cast's gathers) publishes every step through the collective transport; a consumer
(the rescorer) fetches each version while the learner trains the next step, so rank 0's
"sends" thread sends buckets on its pair while its training thread runs the group's
collectives. Over many steps every call returns within its timeout (a wait cycle would
hang one), at least one fetch ran while a step trained (else this tests nothing), and the
consumer loads, byte for byte, the version the learner staged.
"""

import pytest
import ray
import torch
from support.batches import sampled_batch

from opdflow.compute.scoring import token_logprobs
from opdflow.config import LearnerResources, TrainConfig
from opdflow.inputs.models import load_model
from opdflow.stages.learner_actor import learner_class
from opdflow.stages.rescorer import RescorerActor
from opdflow.stages.specs import LearnerSpec, RescorerSpec
from opdflow.weights.transport import Collective

STEPS = 12
BUCKET = 64 * 2**10
"""64 KiB: a tiny model's version moves in a few dozen buckets."""
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def batch(tiny, tokenizer):
    b = sampled_batch(tiny, tokenizer, prompts=3, n=3, max_new_tokens=6)
    with torch.no_grad():
        teacher, _ = token_logprobs(load_model(str(tiny.teacher), "float32"), b)
    return b.replace(logp_rescore_B_T=b.logp_engine_B_T, logp_teacher_B_T=teacher.numpy())


def _digests():
    """Functions run on actors by __ray_call__ (nested: pickled by value, this test module
    is not importable in the workers)."""

    def _staged_digest(actor, version):
        """(on the learner) sha256 of the tensors of a version it holds, as staged."""
        import hashlib

        import torch

        from opdflow.weights.version import views

        packed = actor.publisher._busy[version]
        h = hashlib.sha256()
        for t in views(packed).values():
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def _loaded_digest(actor):
        """(on the rescorer) (version, sha256 of its model's tensors): what it loaded."""
        import hashlib

        import torch

        h = hashlib.sha256()
        for t in actor.stage.model.state_dict().values():
            h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
        return actor.stage.version, h.hexdigest()

    return _staged_digest, _loaded_digest


def test_fetches_beside_a_two_rank_learner_never_hang_and_load_the_staged_bytes(
    ray_local, tiny, batch
):
    staged_digest, loaded_digest = _digests()
    train = TrainConfig(micro_batch_tokens=40)
    learner = (
        learner_class()
        .options(num_cpus=0.5)
        .remote(
            LearnerSpec(str(tiny.student), train, 0, LearnerResources(workers=2),
                        Collective(bucket_bytes=BUCKET, timeout_s=TIMEOUT_S)),
            [{"num_cpus": 0.5}],
        )
    )  # fmt: skip
    consumer = ray.remote(RescorerActor).options(num_cpus=0).remote(RescorerSpec(str(tiny.student)))
    try:
        weights = ray.get(learner.publish.remote(), timeout=TIMEOUT_S)
        staged = {0: ray.get(learner.__ray_call__.remote(staged_digest, 0))}
        for step in range(STEPS):
            trained = learner.train_step.remote(step, batch)
            # version `step` is sent while the learner's ranks run step `step`'s collectives
            rescored = consumer.rescore.remote(weights, batch, step=step)
            out = ray.get(trained, timeout=TIMEOUT_S)
            ray.get(rescored, timeout=TIMEOUT_S)
            assert ray.get(consumer.__ray_call__.remote(loaded_digest)) == (step, staged[step])
            weights = out["weights"]
            staged[step + 1] = ray.get(learner.__ray_call__.remote(staged_digest, step + 1))
            ray.get(learner.retain.remote([step + 1], step + 1))
        assert len(set(staged.values())) == STEPS + 1  # every step moved the weights
        spans = {
            name: [s for s in ray.get(actor.drain_spans.remote()) if s[0] == name]
            for name, actor in (("learner", learner), ("fetch", consumer))
        }
        assert len(spans["fetch"]) == STEPS - 1  # versions 1..STEPS-1 (it starts at 0)
        overlapped = [
            f for f in spans["fetch"]
            if any(t[3] < f[3] + f[4] and f[3] < t[3] + t[4] for t in spans["learner"])
        ]  # fmt: skip
        assert overlapped, (spans["fetch"], spans["learner"])
    finally:
        ray.kill(consumer)
        ray.kill(learner)
