"""The learner: AdamW on the student with the OPD loss (or an RL baseline), micro-batch by
micro-batch, on its own device; no Ray here (stages/learner_actor.py wraps it).

It trains step n on a batch from version v <= n and measures staleness mismatch
d_stale = mean(logp_rescore - logp_learner) on the way. Memory is set by a token budget:
the step's responses are packed into micro-batches of at most `train.micro_batch_tokens`
padded tokens, each one's loss normalised by the whole step's tokens, and gradients
accumulate, so the update equals one full-batch step's. The student is one FP32 module
for a single CPU worker, and FSDP2 shards (fsdp.py) for N workers or a GPU: bf16 compute,
FP32 master weights and reductions, no rank ever holding the whole model or optimizer.
Checkpoints are torch.distributed.checkpoint shards that reshard on resume (checkpoint.py).
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opdflow.compute.device import PeakMemory, stage_device, tensor_bytes, to_host
from opdflow.compute.fsdp import DistSpec
from opdflow.compute.losses import (
    LossOptions,
    advantage,
    advantage_needs_learner,
    importance_weight,
    token_loss,
)
from opdflow.compute.scoring import score_tokens
from opdflow.config import TrainConfig
from opdflow.core import microbatch
from opdflow.core.mismatch import MismatchStats, engine_mismatch
from opdflow.core.rollout import RolloutBatch
from opdflow.record.checkpoint import LearnerSaves
from opdflow.weights.cast import BF16Cast, bf16_entries, write_bf16
from opdflow.weights.memory import WeightMemory
from opdflow.weights.version import PackedWeights, allocate


@dataclass(frozen=True)
class Accumulated:
    """What one step's forward and backward passes leave besides the gradients."""

    logp_B_T: np.ndarray
    """The learner's detached log-probabilities of the whole batch (host memory)."""
    entropy_B_T: np.ndarray
    """Next-token entropy of the whole batch, nats (host memory)."""
    loss: float
    """The step's loss: the sum of every micro-batch's share, over all ranks."""
    micro_batches: int
    """Micro-batches of the whole step (over all ranks)."""


class Learner:
    """The trained student: one rank of it (rank 0 of 1 when not data-parallel)."""

    def __init__(
        self,
        model_path: str,
        train: TrainConfig,
        seed: int = 0,
        *,
        device: str | None = None,
        dist: DistSpec | None = None,
        shard: bool | None = None,
    ):
        """`dist` places this rank in a group of learners; `shard` forces FSDP2 on (e.g. at
        world size 1) or off; by default it shards when data-parallel or on a GPU."""
        self.device = stage_device(device)
        self.rank, self.world = (dist.rank, dist.world) if dist else (0, 1)
        self.sharded = (self.world > 1 or self.device.type == "cuda") if shard is None else shard
        if self.world > 1 and not self.sharded:
            raise ValueError("a data-parallel learner is sharded: shard=False needs world 1")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(seed)
        self.train_cfg = train
        if self.sharded:
            from opdflow.compute.fsdp import build_sharded, init_process_group

            init_process_group(self.device, dist)
            self.model = build_sharded(
                model_path, self.device, self.world, self.compute_dtype,
                train.activation_checkpointing,
            )  # fmt: skip
        else:
            from opdflow.compute.fsdp import enable_activation_checkpointing
            from opdflow.inputs.models import load_model

            self.model = load_model(model_path, "float32", str(self.device)).train()
            if train.activation_checkpointing:
                enable_activation_checkpointing(self.model)
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=train.lr,
            weight_decay=train.weight_decay,
            betas=(0.9, 0.999),
        )
        self.options = LossOptions(
            train.advantage_from, train.is_clip, train.center_advantage, train.loss
        )
        self.weights_bytes = 2 * sum(p.numel() for p in self.model.parameters())
        """Bytes of the published BF16 weights (global sizes, sharded or not)."""
        self.version = 0
        self.trained_steps: list[tuple[int, int]] = []  # (step, batch version)
        self.bad_steps = 0
        self.cast = BF16Cast(not self.sharded, WeightMemory(self.device))
        """Publishing's FP32 -> BF16 cast into host staging, beside the next step: on a side
        stream on a GPU, in a thread on an unsharded CPU learner (the step settles it
        before its optimizer writes the weights), else in the caller (weights/cast.py)."""
        self.saves = LearnerSaves()
        """This rank's checkpoint saves (one at a time, in the background or not)."""

    @property
    def compute_dtype(self) -> torch.dtype:
        choice = self.train_cfg.compute_dtype
        if choice == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return getattr(torch, choice)

    # ---------------------------------------------------------------- the step

    def train_step(self, step: int, batch: RolloutBatch) -> dict[str, Any]:
        """One update on `batch` (every rank calls it with the whole batch); its metrics."""
        if step != self.version:
            raise RuntimeError(
                f"learner is at version {self.version} but was asked to train step {step}"
            )
        if self.options.loss != "opd" and batch.reward_B is None:
            raise RuntimeError(
                f"train.loss={self.options.loss!r} needs a 0/1 reward per response, but the "
                "batch has none: the prompts have no reference answers (an `answer` column)"
            )
        t0 = time.perf_counter()
        memory = PeakMemory(self.device, self.held_bytes())
        self.opt.zero_grad(set_to_none=True)
        acc = self.accumulate_gradients(batch)
        logp_B_T, mask = acc.logp_B_T, batch.response_mask_B_T
        tokens = max(int(mask.sum()), 1)
        kl = None if batch.logp_teacher_B_T is None else (logp_B_T - batch.logp_teacher_B_T)
        stats = {"loss": acc.loss}
        if kl is not None:
            stats["train_kl"] = float(np.where(mask, kl, 0.0).sum() / tokens)
        skipped = not math.isfinite(acc.loss)
        grad_norm = float("nan")
        if skipped:
            self.bad_steps += 1
            self.opt.zero_grad(set_to_none=True)
        else:
            for group in self.opt.param_groups:  # warm-up is a function of the step: resumable
                group["lr"] = self.train_cfg.lr * min(
                    1.0, (step + 1) / max(self.train_cfg.warmup_steps, 1)
                )
            grad_norm = self._clip_and_step()
        self.version = step + 1
        self.trained_steps.append((step, batch.version))
        d_stale = MismatchStats.of(batch.logp_rescore_B_T, logp_B_T, mask)
        d_total = MismatchStats.of(batch.logp_engine_B_T, logp_B_T, mask)
        d_engine = engine_mismatch(batch)
        reward = batch.reward_B
        return {
            **stats,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "bad_steps": self.bad_steps,
            "responses": batch.num_responses,
            "tokens": d_engine.tokens,
            "train_reward": float("nan") if reward is None else float(np.mean(reward)),
            "entropy": float((acc.entropy_B_T * mask).sum() / tokens),
            "response_len": d_engine.tokens / max(batch.num_responses, 1),
            "d_engine_k1": d_engine.k1,
            "d_engine_k3": d_engine.k3,
            "d_engine_exact": d_engine.exact,
            "d_stale_k1": d_stale.k1,
            "d_stale_k3": d_stale.k3,
            "d_total_k1": d_total.k1,
            "d_total_k3": d_total.k3,
            "train_s": time.perf_counter() - t0,
            "gen_s": batch.gen_seconds,
            "tokens_per_s": d_engine.tokens / batch.gen_seconds
            if batch.gen_seconds
            else float("nan"),
            "micro_batches": acc.micro_batches,
            "learner_peak_mem_gb": self._max_over_ranks(memory.gb()),
            "weights_bytes": self.weights_bytes,
            "cast_wait_s": self._take_cast_wait(),
        }

    def micro_batches(self, batch: RolloutBatch) -> list[np.ndarray]:
        """The step's micro-batches (row indices), at least one per rank."""
        if batch.num_responses < self.world:
            raise RuntimeError(
                f"a batch of {batch.num_responses} responses cannot be split over {self.world} "
                "learner workers: lower resources.learner.workers or raise data.prompts_per_step"
            )
        return microbatch.of_batch(batch, self.train_cfg.micro_batch_tokens, self.world)

    def accumulate_gradients(self, batch: RolloutBatch) -> Accumulated:
        """Forward and backward over this rank's micro-batches, gradients accumulated in the
        parameters (summed over ranks by FSDP): those of the loss over the whole batch."""
        plan = self.micro_batches(batch)
        mine = microbatch.deal(plan, self.world)[self.rank]
        tokens = float(max(batch.response_mask_B_T.sum(), 1))
        adv_all = None  # the whole batch's advantage, where a micro-batch cannot make its own
        if not advantage_needs_learner(self.options):
            adv_all = self._advantage(batch, None)
        elif self.options.center_advantage:  # the centre needs every token's logp first
            with torch.no_grad():
                adv_all = self._advantage(batch, self._scores(batch, mine, False)[0])
        logp, entropy, loss = self._scores(batch, mine, True, adv_all, tokens)
        return Accumulated(logp, entropy, loss, len(plan))

    def _scores(
        self,
        batch: RolloutBatch,
        mine: list[np.ndarray | None],
        grad: bool,
        adv_all: torch.Tensor | None = None,
        tokens: float = 1.0,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Score this rank's micro-batches (and, with grad, backward each one's loss); the
        whole batch's logp and entropy, gathered from every rank, and the loss (the sum of
        every rank's micro-batch losses; 0 without grad)."""
        B, T = batch.response_ids_B_T.shape
        logp = torch.zeros(B, T, device=self.device)
        entropy = torch.zeros(B, T, device=self.device)
        loss_sum = torch.zeros(1, device=self.device)
        chunk = self.train_cfg.logit_chunk_tokens
        for rows in mine:
            mb = batch.select(rows if rows is not None else [0])  # None: a placeholder
            with torch.set_grad_enabled(grad):
                s = score_tokens(self.model, mb, entropy=True, chunk_tokens=chunk)
                if grad:
                    loss = self._loss(mb, rows, s.logp_B_T, adv_all, tokens)
            if grad:
                loss.backward()
                loss_sum += loss.detach().float()
            if rows is not None:
                width = mb.response_ids_B_T.shape[1]
                index = torch.from_numpy(rows).to(self.device)
                logp[index, :width] = s.logp_B_T.detach().float()
                entropy[index, :width] = s.entropy_B_T.float()
        if self.world > 1:  # each row was scored by one rank, zeros elsewhere: a sum gathers
            torch.distributed.all_reduce(logp)
            torch.distributed.all_reduce(entropy)
            torch.distributed.all_reduce(loss_sum)
        return to_host(logp), to_host(entropy), float(loss_sum.item())

    def _loss(
        self,
        mb: RolloutBatch,
        rows: np.ndarray | None,
        logp_B_T: torch.Tensor,
        adv_all: torch.Tensor | None,
        tokens: float,
    ) -> torch.Tensor:
        """A micro-batch's share of the step's loss (0 for a placeholder)."""
        if rows is None:
            return logp_B_T.sum() * 0.0  # the collectives of a forward and backward, no gradient
        width = logp_B_T.shape[1]

        def on_device(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.tensor(a, device=self.device)

        mask = on_device(mb.response_mask_B_T)
        engine = on_device(mb.logp_engine_B_T)
        if adv_all is not None:
            adv = adv_all[torch.from_numpy(rows), :width].to(self.device)
        else:
            adv = advantage(logp_B_T, on_device(mb.logp_teacher_B_T), mask, engine, self.options)
        weight = importance_weight(logp_B_T, engine, self.options)
        return token_loss(logp_B_T, adv, mask, weight, tokens)

    def _advantage(self, batch: RolloutBatch, logp_B_T: np.ndarray | None) -> torch.Tensor:
        """The whole batch's advantage on the host (what a micro-batch cannot compute alone)."""

        return advantage(
            _host(logp_B_T), _host(batch.logp_teacher_B_T), _host(batch.response_mask_B_T),
            _host(batch.logp_engine_B_T), self.options, _host(batch.reward_B),
            _host(batch.prompt_index_B),
        )  # fmt: skip

    def _clip_and_step(self) -> float:
        """Clip the gradient norm, AdamW step; returns the norm before clipping."""
        clip = self.train_cfg.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else float("inf")
        )
        self.cast.settle()  # the previous version's cast may still be reading the weights
        self.opt.step()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def held_bytes(self) -> int:
        """Bytes of the tensors this rank holds between steps: its parameters (shards),
        their gradients and the optimizer's state."""
        params = list(self.model.parameters())
        state = (t for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t))
        return tensor_bytes([*params, *(p.grad for p in params), *state])

    def _max_over_ranks(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    # ---------------------------------------------------------------- weights out

    def bf16_entries(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of each published tensor: floating ones in BF16, in order."""
        return bf16_entries(self.model.state_dict())

    def cast_bf16(self, packed: PackedWeights | None) -> Future:
        """Start casting the current weights to BF16 straight into `packed` (rank 0's
        host staging, laid out by `bf16_entries`; None on the other ranks): BF16Cast,
        beside the next step where it can be. The future is done once the bytes are
        complete. Every rank must call this (sharded tensors are gathered one at a time)."""
        return self.cast.start(self.model.state_dict(), packed)

    def _take_cast_wait(self) -> float:
        """Seconds this step waited for the previous version's cast (then reset)."""
        waited, self.cast.waited_s = self.cast.waited_s, 0.0
        return waited

    def bf16_weights(self) -> PackedWeights | None:
        """The current weights in BF16 in a new host buffer, cast now (rank 0; None on the
        others); every rank must call this. The learner actor publishes through reused
        staging instead (weights/publisher.py)."""
        packed = allocate(self.bf16_entries(), self.version) if self.rank == 0 else None
        write_bf16(self.model.state_dict(), packed)
        return packed

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, out_dir: str, background: bool = False) -> None:
        """Every rank writes its shards (torch.distributed.checkpoint); rank 0 the counters.
        background: return once the state is copied into host memory, the files written in
        a thread (`checkpoint_written` says when); one save at a time."""
        self.saves.wait()
        if self.rank == 0:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / "learner.json").write_text(json.dumps(self._meta()))
        self.saves.start(self.model, self.opt, Path(out_dir), background)

    def checkpoint_written(self, wait: bool = False) -> bool:
        """Whether the last save is completely written (rank 0: by every rank, metadata
        included); wait: until it is. A failed save raises here."""
        return self.saves.wait() if wait else self.saves.done()

    def load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        """Every rank reads its shards, from a checkpoint of any number of workers."""
        from opdflow.record.checkpoint import load_learner

        self.cast.settle()  # a running cast reads the weights this overwrites
        load_learner(self.model, self.opt, Path(ckpt_dir))
        meta = json.loads((Path(ckpt_dir) / "learner.json").read_text())
        if meta["version"] != step:
            raise RuntimeError(
                f"checkpoint {ckpt_dir} holds version {meta['version']}, expected {step}"
            )
        self.version, self.bad_steps = step, meta["bad_steps"]
        self.trained_steps = [tuple(x) for x in meta["trained_steps"]]

    def _meta(self) -> dict[str, Any]:
        """learner.json: the learner's counters and its record of trained steps."""
        return {
            "version": self.version,
            "bad_steps": self.bad_steps,
            "trained_steps": self.trained_steps,
            "workers": self.world,
        }

    def record(self) -> list[tuple[int, int]]:
        return list(self.trained_steps)

    def close(self) -> None:
        """End this rank, every rank at once: the running cast and save settle, then the
        process group goes. A process that leaves a gloo group to interpreter exit may
        abort there (its worker threads still hold tensors), so one that owns a learner
        ends it here; an actor that is killed needs nothing."""
        self.cast.close()
        self.saves.wait()
        if self.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()  # no rank tears down while a peer still sends to it
                dist.destroy_process_group()


def _host(a: np.ndarray | None) -> torch.Tensor | None:
    """A batch array as a CPU tensor (a copy: arrays from the object store are read-only)."""
    return None if a is None else torch.tensor(a)
