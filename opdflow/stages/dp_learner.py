"""The data-parallel learner: N Ray actors, one torch.distributed group, the student in FSDP2.

One learner actor cannot hold a paper-scale student: 7B parameters need ~112 GB of FP32
weights, gradients and AdamW moments. With resources.learner.workers = N the learner is N
ranks; FSDP2 (torch.distributed.fsdp.fully_shard, one group per decoder layer plus the
root) keeps 1/N of every parameter, gradient and optimizer moment on each. The backend is
gloo on CPU and NCCL when the learner's actors have GPUs (the model then sits on the GPU;
not yet run: scoring.token_logprobs and Learner.train_step still build CPU tensors).

Rank 0 is the learner the controller sees: it starts ranks 1..N-1 (owned by it, so they
die with it), picks the rendezvous address (its node IP and a free port), and forwards
every call that needs all ranks (train_step, publish, save/load_checkpoint) to them before
running its own part. The batch is split by rows; each rank scores its rows and all-gathers
the others' detached log-probabilities, so advantages, GRPO groups, centring and every
metric are computed on the whole batch exactly as one learner would. The loss is the
global token mean; its gradient on each rank covers that rank's rows, and FSDP2's
gradient mean over ranks is undone by scaling the backward by N (gloo cannot sum with a
pre-scale), so the update equals one learner's within float reduction order.

Published weights and checkpoints are gathered to full tensors on rank 0: a checkpoint is
the single learner's format (optimizer state numbered in model.parameters() order), so a
run checkpointed with N workers resumes with M.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import ray
import torch

from opdflow.rollout import RolloutBatch
from opdflow.scoring import score_tokens
from opdflow.stages.learner import Learner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rows_of(batch: RolloutBatch, lo: int, hi: int) -> RolloutBatch:
    """Rows lo:hi of a batch (every per-response array and the answers)."""
    B = batch.num_responses
    changes: dict[str, Any] = {"answers": list(batch.answers[lo:hi]) if batch.answers else []}
    for name, value in vars(batch).items():
        if isinstance(value, np.ndarray) and value.ndim and value.shape[0] == B:
            changes[name] = value[lo:hi]
    return batch.replace(**changes)


class DataParallelLearner(Learner):
    """One rank of the data-parallel learner (a Ray actor); rank 0 leads the others."""

    def __init__(
        self,
        model_path: str,
        threads: int,
        train: dict[str, Any],
        seed: int,
        workers: int,
        peer_options: list[dict[str, Any]] | None = None,
        rank: int = 0,
        rendezvous: str | None = None,
    ):
        import torch.distributed as dist

        if workers < 2:
            raise ValueError(f"a data-parallel learner needs workers >= 2, got {workers}")
        self.rank, self.world = rank, workers
        self.peers: list[Any] = []
        if rank == 0:
            rendezvous = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
            options = peer_options or [{} for _ in range(workers - 1)]
            self.peers = [
                ray.remote(DataParallelLearner)
                .options(**options[r - 1])
                .remote(model_path, threads, train, seed, workers, None, r, rendezvous)
                for r in range(1, workers)
            ]
        gpu = torch.cuda.is_available() and bool(ray.get_gpu_ids())
        self.device = torch.device("cuda", 0) if gpu else torch.device("cpu")
        if gpu:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            "nccl" if gpu else "gloo", init_method=rendezvous, rank=rank, world_size=workers
        )
        super().__init__(model_path, threads, train, seed)
        self.names = [name for name, _ in self.model.named_parameters()]

    # ---------------------------------------------------------------- FSDP2

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        model = model.to(self.device)
        for layer in getattr(getattr(model, "model", None), "layers", []):  # HF decoder layers
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)  # embeddings, final norm and head (tied or not)
        return model

    def _score(self, batch: RolloutBatch) -> tuple[torch.Tensor, float]:
        responses, T = batch.response_ids_B_T.shape
        if responses < self.world:
            raise RuntimeError(
                f"a batch of {responses} responses cannot be split over {self.world} learner workers: "
                "lower resources.learner.workers or raise data.prompts_per_step"
            )
        bounds = np.linspace(0, responses, self.world + 1).round().astype(int)
        lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
        mine = rows_of(batch, lo, hi)
        scores = score_tokens(
            self.model, mine, entropy=True, chunk_tokens=self.train_cfg["logit_chunk_tokens"]
        )
        logp_mine_R_T, ent_R_T = scores.logp_B_T, scores.entropy_B_T
        mask_R_T = torch.tensor(mine.response_mask_B_T, device=logp_mine_R_T.device)
        with torch.no_grad():
            sums = torch.stack([(ent_R_T * mask_R_T).sum(), mask_R_T.sum().to(ent_R_T.dtype)])
        rows = int(np.diff(bounds).max())
        padded = torch.zeros(rows, T, dtype=logp_mine_R_T.dtype, device=logp_mine_R_T.device)
        padded[: hi - lo] = logp_mine_R_T.detach()
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        torch.distributed.all_gather(parts, padded)
        torch.distributed.all_reduce(sums)
        logp_B_T = torch.cat(
            [
                logp_mine_R_T if r == self.rank else parts[r][: bounds[r + 1] - bounds[r]]
                for r in range(self.world)
            ]
        )
        return logp_B_T, float(sums[0] / sums[1].clamp_min(1))

    def _update(self, loss: torch.Tensor) -> float:
        self.opt.zero_grad(set_to_none=True)
        (loss * self.world).backward()  # FSDP2 averages gradients over ranks: sum them
        clip = self.train_cfg["grad_clip"]
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else float("inf")
        )
        self.opt.step()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=full)
        return state if self.rank == 0 else None

    def add_span(self, *args: Any, **kwargs: Any) -> None:
        if self.rank == 0:  # rank 0's spans stand for the learner (the others are not drained)
            super().add_span(*args, **kwargs)

    # ---------------------------------------------------------------- calls on every rank

    def _on_peers(self, method: str, *args: Any) -> list:
        return [getattr(peer, method).remote(*args) for peer in self.peers]

    def train_step(self, step: int, batch: RolloutBatch) -> dict[str, Any]:
        refs = self._on_peers("train_step", step, ray.put(batch)) if self.peers else []
        out = super().train_step(step, batch)
        ray.get(refs)
        return out

    def publish(self) -> list:
        refs = self._on_peers("publish")
        out = self._publish()
        ray.get(refs)
        return out

    def save_checkpoint(self, out_dir: str) -> None:
        import json
        from pathlib import Path

        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        from opdflow.checkpoint import save_learner_state

        refs = self._on_peers("save_checkpoint", out_dir)
        model_state = self._full_state()
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        opt_state = get_optimizer_state_dict(self.model, self.opt, options=full)
        if self.rank == 0:
            index = {name: i for i, name in enumerate(self.names)}
            torch_layout = {
                "state": {index[name]: st for name, st in opt_state["state"].items()},
                "param_groups": [
                    {**g, "params": [index[name] for name in g["params"]]}
                    for g in opt_state["param_groups"]
                ],
            }
            save_learner_state(model_state, torch_layout, Path(out_dir))
            (Path(out_dir) / "learner.json").write_text(json.dumps(self._meta()))
        ray.get(refs)

    def load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        """Rank 0 reads the checkpoint (of any number of workers) and broadcasts it."""
        import json
        from pathlib import Path

        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from opdflow.checkpoint import read_learner_state

        refs = self._on_peers("load_checkpoint", ckpt_dir, step)
        model_state: dict[str, Any] = {}
        opt_state: dict[str, Any] = {}
        shared: list[Any] = [None, None]
        if self.rank == 0:
            model_state, torch_layout, rng = read_learner_state(Path(ckpt_dir))
            opt_state = {
                "state": {self.names[i]: st for i, st in torch_layout["state"].items()},
                "param_groups": [
                    {**g, "params": [self.names[i] for i in g["params"]]}
                    for g in torch_layout["param_groups"]
                ],
            }
            shared = [json.loads((Path(ckpt_dir) / "learner.json").read_text()), rng]
        from_rank0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, model_state, options=from_rank0)
        set_optimizer_state_dict(self.model, self.opt, opt_state, options=from_rank0)
        torch.distributed.broadcast_object_list(shared, src=0, device=self.device)
        meta, rng = shared
        torch.set_rng_state(rng)
        self._restore_meta(meta, ckpt_dir, step)
        ray.get(refs)
