"""The learner's random state in checkpoints: the CPU generator's always, the CUDA
generators' on a GPU learner, and what a resume does with each (record/checkpoint.py).

On CPU: a saved and reloaded learner draws the numbers the uninterrupted one would, a CPU
learner's checkpoint holds no CUDA state, and one that holds it (a GPU run's) resumes on a
CPU learner with its CPU state restored and the CUDA rows left alone. The branch that
decides is checked for every case. The GPU round trip itself is marked `gpu`.
"""

from __future__ import annotations

import pytest
import torch

from opdflow.record import checkpoint


def _learner(device: str = "cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4, device=device)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize(
    ("saved", "device", "action"),
    [
        (True, "cuda", "restore"),
        (False, "cuda", "seeded"),
        (True, "cpu", "drop"),
        (False, "cpu", "none"),
    ],
)
def test_the_branch_follows_the_checkpoint_and_the_learners_device(saved, device, action):
    assert checkpoint.cuda_rng_action(saved, device) == action


def test_a_resumed_cpu_learner_draws_what_the_uninterrupted_one_draws(tmp_path):
    model, opt = _learner()
    torch.manual_seed(123)
    torch.rand(7)  # the run has used its generator before the checkpoint
    checkpoint.save_learner(model, opt, tmp_path / "ckpt")
    uninterrupted = torch.rand(16)
    torch.manual_seed(999)  # a fresh process, seeded as at start
    assert not torch.equal(torch.rand(16), uninterrupted)
    fresh, fresh_opt = _learner()
    assert checkpoint.load_learner(fresh, fresh_opt, tmp_path / "ckpt") == "none"
    assert torch.equal(torch.rand(16), uninterrupted)
    assert checkpoint.rng_state(torch.device("cpu")).keys() == {"rng"}  # no CUDA rows on a CPU


def test_a_gpu_runs_checkpoint_resumes_on_a_cpu_learner_with_its_cpu_state(tmp_path):
    """A checkpoint that holds CUDA rows (as a GPU learner writes them) loads on a CPU
    learner: the CPU generator is restored, the CUDA rows are not asked for."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = _learner()
    torch.manual_seed(5)
    model_state, optim_state = get_state_dict(model, opt)
    rows = torch.arange(32, dtype=torch.uint8).reshape(2, 16)  # two GPUs' generator states
    state = {"model": model_state, "optim": optim_state, "rng": torch.get_rng_state(),
             checkpoint.CUDA_RNG: rows}  # fmt: skip
    with checkpoint.single_process_quiet():
        dcp.save(state, checkpoint_id=str(tmp_path / "gpu"), no_dist=True)
    expected = torch.rand(8)
    saved = dcp.FileSystemReader(str(tmp_path / "gpu")).read_metadata().state_dict_metadata
    assert tuple(saved[checkpoint.CUDA_RNG].size) == (2, 16)
    fresh, fresh_opt = _learner()
    assert checkpoint.load_learner(fresh, fresh_opt, tmp_path / "gpu") == "drop"
    assert torch.equal(torch.rand(8), expected)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_resumed_gpu_learner_samples_what_the_uninterrupted_one_samples(tmp_path):
    model, opt = _learner("cuda")
    torch.cuda.manual_seed_all(77)
    torch.rand(5, device="cuda")
    checkpoint.save_learner(model, opt, tmp_path / "ckpt")
    uninterrupted = (torch.rand(16), torch.rand(16, device="cuda"))
    torch.manual_seed(1)  # a restarted process, seeded as at start
    fresh, fresh_opt = _learner("cuda")
    assert checkpoint.load_learner(fresh, fresh_opt, tmp_path / "ckpt") == "restore"
    assert torch.equal(torch.rand(16), uninterrupted[0])
    assert torch.equal(torch.rand(16, device="cuda"), uninterrupted[1])
