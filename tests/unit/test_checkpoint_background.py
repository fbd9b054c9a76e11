"""A checkpoint written in the background (DCP's asynchronous save) holds the state of the
moment it was asked for, byte for byte, though the learner's weights and AdamW moments
change right after the call returns; it is complete only once `checkpoint_written` says so,
and it loads like a synchronous one."""

from __future__ import annotations

import json

import torch

from opdflow.config import TrainConfig


def _moved(learner, scale: float) -> None:
    """An optimizer step's worth of change: gradients, then AdamW (its moments exist after)."""
    for p in learner.model.parameters():
        p.grad = scale * torch.ones_like(p)
    learner.opt.step()
    learner.opt.zero_grad(set_to_none=True)


def test_a_background_save_holds_the_state_it_was_asked_for(tmp_path, tiny):
    from opdflow.record.checkpoint import read_state
    from opdflow.stages.learner import Learner

    learner = Learner(str(tiny.student), TrainConfig())
    _moved(learner, 1e-2)
    learner.save_checkpoint(str(tmp_path / "sync"))
    learner.save_checkpoint(str(tmp_path / "background"), background=True)
    _moved(learner, -3e-2)  # the next step writes the weights while the files are written
    assert learner.checkpoint_written(wait=True)
    assert learner.checkpoint_written()  # nothing left being written
    for prefix in ("model.", "optim.state."):
        sync, background = (read_state(tmp_path / d, prefix) for d in ("sync", "background"))
        assert sync.keys() == background.keys() and sync
        for name in sync:
            assert torch.equal(sync[name], background[name]), name
    meta = json.loads((tmp_path / "background" / "learner.json").read_text())
    assert meta == json.loads((tmp_path / "sync" / "learner.json").read_text())

    again = Learner(str(tiny.student), TrainConfig())
    again.load_checkpoint(str(tmp_path / "background"), meta["version"])
    saved = read_state(tmp_path / "sync")
    for name, value in again.model.state_dict().items():
        assert torch.equal(value, saved[name]), name
