"""The learner actor on real tiny batches: a non-finite loss skips the step, nothing else."""

import numpy as np
import ray
from support.batches import sampled_batch

from opdflow.config import TrainConfig
from opdflow.stages.learner_actor import learner_class
from opdflow.stages.specs import LearnerSpec
from opdflow.weights.fetcher import fetch_state


def test_a_nan_loss_is_skipped_and_reported_and_weights_stay(ray_local, tiny, tokenizer):
    batch = sampled_batch(tiny, tokenizer, prompts=4, n=2, max_new_tokens=6)
    bad = batch.replace(
        logp_rescore_B_T=batch.logp_engine_B_T,
        logp_teacher_B_T=np.full_like(batch.logp_engine_B_T, np.nan),
    )
    learner = learner_class().remote(LearnerSpec(str(tiny.student), TrainConfig()))
    before = fetch_state(ray.get(learner.publish.remote()))
    out = ray.get(learner.train_step.remote(0, bad))
    assert out["skipped"] is True
    assert out["bad_steps"] == 1
    after = fetch_state(out["weights"])
    assert all(np.array_equal(before[k].float().numpy(), after[k].float().numpy()) for k in before)
    good = batch.replace(
        logp_rescore_B_T=batch.logp_engine_B_T, logp_teacher_B_T=batch.logp_engine_B_T - 1.0
    )
    out = ray.get(learner.train_step.remote(1, good))
    assert out["skipped"] is False
    assert out["bad_steps"] == 1
    assert ray.get(learner.record.remote()) == [(0, 0), (1, 0)]
    ray.kill(learner)
