"""The held-out evaluator and the teacher scorer on the tiny models, without Ray: the
evaluator's KL is zero for a student scored against itself and repeats with its seed; the
teacher scorer is the rescorer's prefill with the teacher's weights."""

import numpy as np
import pytest

from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.engines.torch_engine import TorchEngine
from opdflow.inputs.data import load_prompts
from opdflow.stages.evaluator import Evaluator
from opdflow.stages.rescorer import Rescorer
from opdflow.stages.teacher import TeacherScorer


@pytest.fixture(scope="module")
def prompts(tiny, tokenizer):
    return load_prompts(tiny.heldout, tokenizer, limit=4)


def test_heldout_kl_is_zero_against_itself_and_the_seed_repeats_it(tiny, prompts):
    args = (prompts.token_ids, prompts.answers, 2, 8)
    itself = Evaluator(str(tiny.student), str(tiny.student), str(tiny.tokenizer), batch_prompts=2)
    out = itself.heldout(*args, 0)
    assert len(out["kl_sum_P"]) == len(prompts) and all(t > 0 for t in out["tokens_P"])
    assert np.allclose(out["kl_sum_P"], 0.0, atol=1e-6), out["kl_sum_P"]
    taught = Evaluator(str(tiny.student), str(tiny.teacher), str(tiny.tokenizer), batch_prompts=2)
    first, again = taught.heldout(*args, 0), taught.heldout(*args, 0)
    assert list(first["kl_sum_P"]) == list(again["kl_sum_P"])  # one seed, the same samples
    assert first["kl"] > 0 and list(first["tokens_P"]) == list(again["tokens_P"])


def test_the_teacher_scorer_is_the_rescorer_with_the_teachers_weights(tiny, tokenizer, prompts):
    engine = TorchEngine(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, "bf16")
    request = GenerationRequest(prompts.token_ids, list(range(len(prompts))), prompts.answers,
                                2, 3, 0, SamplingParams(1.0, 1.0, 8))  # fmt: skip
    batch = engine.generate(request)
    teacher = TeacherScorer(str(tiny.teacher)).score(batch)
    rescored = Rescorer(str(tiny.teacher)).rescore(batch)
    mask = batch.response_mask_B_T
    assert np.array_equal(teacher.logp_teacher_B_T[mask], rescored.logp_rescore_B_T[mask])
    student = Rescorer(str(tiny.student)).rescore(batch)
    assert not np.allclose(teacher.logp_teacher_B_T[mask], student.logp_rescore_B_T[mask])
