"""The learner: AdamW on the student with the OPD loss (or an RL baseline); publishes each version.

It keeps FP32 master weights, trains step n on a batch from version v <= n, and
ray.put()s the BF16 weights of version n+1 as one flat buffer (see weights.py). It also
measures staleness mismatch d_stale = mean(logp_rescore - logp_learner) before updating.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import ray
import torch

from opdflow.losses import LossOptions, policy_loss
from opdflow.mismatch import MismatchStats, engine_mismatch
from opdflow.rollout import RolloutBatch
from opdflow.scoring import score_tokens
from opdflow.stages import StageActor, pin_threads
from opdflow.weights import pack


class Learner(StageActor):
    """The trained student (a Ray actor)."""

    def __init__(self, model_path: str, threads: int, train: dict[str, Any], seed: int):
        from opdflow.models import load_model

        pin_threads(threads)
        torch.manual_seed(seed)
        self.model = self._wrap(load_model(model_path, "float32").train())
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=train["lr"],
            weight_decay=train["weight_decay"],
            betas=(0.9, 0.999),
        )
        self.train_cfg = train
        self.options = LossOptions(
            train["advantage_from"], train["is_clip"], train["center_advantage"], train["loss"]
        )
        self.version = 0
        self.trained_steps: list[
            tuple[int, int]
        ] = []  # (step, batch version): the learner's own record
        self.bad_steps = 0

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as trained (the data-parallel learner shards it here)."""
        return model

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        """The full FP32 state dict to publish or save (None on ranks that do not publish)."""
        return self.model.state_dict()

    def _score(self, batch: RolloutBatch) -> tuple[torch.Tensor, float]:
        """logp_learner_B_T of the whole batch (with grad) and its token-mean entropy."""
        mask = torch.tensor(batch.response_mask_B_T)
        scores = score_tokens(
            self.model, batch, entropy=True, chunk_tokens=self.train_cfg["logit_chunk_tokens"]
        )
        # collapse signs for the RL baselines: entropy and length
        entropy = float((scores.entropy_B_T * mask).sum() / mask.sum().clamp_min(1))
        return scores.logp_B_T, entropy

    def _update(self, loss: torch.Tensor) -> float:
        """Backward, clip and AdamW step; returns the gradient norm before clipping."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.train_cfg["grad_clip"]
        grad_norm = float(
            torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), clip if clip > 0 else float("inf")
            )
        )
        self.opt.step()
        return grad_norm

    def publish(self) -> list:
        """ray.put the current weights in BF16; returned boxed so the driver holds the ref."""
        return self._publish()

    def _publish(self) -> list:
        t0 = time.perf_counter()
        with self.span("publish", self.version - 1, self.version) as s:
            full = self._full_state()
            if full is None:
                return [None, time.perf_counter() - t0]
            state = {k: v.detach().to(torch.bfloat16) for k, v in full.items()}
            packed = pack(state, self.version)
            ref = ray.put(packed)
            s["bytes"] = packed.nbytes
        return [ref, time.perf_counter() - t0]

    def train_step(self, step: int, batch: RolloutBatch) -> dict[str, Any]:
        if step != self.version:
            raise RuntimeError(
                f"learner is at version {self.version} but was asked to train step {step}"
            )
        t_epoch, t0 = time.time(), time.perf_counter()
        mask = torch.tensor(batch.response_mask_B_T)
        logp_learner, entropy = self._score(batch)
        logp_teacher = torch.tensor(batch.logp_teacher_B_T)
        logp_engine = torch.tensor(batch.logp_engine_B_T)
        reward = None if batch.reward_B is None else torch.tensor(batch.reward_B)
        if self.options.loss != "opd" and reward is None:
            raise RuntimeError(
                f"train.loss={self.options.loss!r} needs a 0/1 reward per response, but the "
                "batch has none: the prompts have no reference answers (an `answer` column)"
            )
        loss, stats = policy_loss(
            logp_learner,
            logp_teacher,
            mask,
            logp_engine,
            self.options,
            reward,
            torch.tensor(batch.prompt_index_B),
        )
        lp = logp_learner.detach().numpy()
        d_stale = MismatchStats.of(batch.logp_rescore_B_T, lp, batch.response_mask_B_T)
        d_total = MismatchStats.of(batch.logp_engine_B_T, lp, batch.response_mask_B_T)
        d_engine = engine_mismatch(batch)
        skipped = not math.isfinite(stats["loss"])
        grad_norm = float("nan")
        if skipped:
            self.bad_steps += 1
        else:
            for group in self.opt.param_groups:  # warm-up is a function of the step: resumable
                group["lr"] = self.train_cfg["lr"] * min(
                    1.0, (step + 1) / max(self.train_cfg["warmup_steps"], 1)
                )
            grad_norm = self._update(loss)
        self.version = step + 1
        self.trained_steps.append((step, batch.version))
        train_s = time.perf_counter() - t0
        self.add_span("learner", step, batch.version, t_epoch, train_s, batch.num_tokens)
        weights = self._publish()
        return {
            **stats,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "bad_steps": self.bad_steps,
            "responses": batch.num_responses,
            "tokens": d_engine.tokens,
            "train_reward": float("nan") if reward is None else float(reward.mean()),
            "entropy": entropy,
            "response_len": d_engine.tokens / max(batch.num_responses, 1),
            "d_engine_k1": d_engine.k1,
            "d_engine_k3": d_engine.k3,
            "d_engine_exact": d_engine.exact,
            "d_stale_k1": d_stale.k1,
            "d_stale_k3": d_stale.k3,
            "d_total_k1": d_total.k1,
            "d_total_k3": d_total.k3,
            "train_s": train_s,
            "gen_s": batch.gen_seconds,
            "tokens_per_s": d_engine.tokens / batch.gen_seconds
            if batch.gen_seconds
            else float("nan"),
            "publish_s": weights[1],
            "weights": weights[:1],
            "weights_bytes": int(sum(p.numel() for p in self.model.parameters()) * 2),
        }

    def record(self) -> list[tuple[int, int]]:
        return list(self.trained_steps)

    def save_checkpoint(self, out_dir: str) -> None:
        from pathlib import Path

        from opdflow.checkpoint import save_learner

        save_learner(self.model, self.opt, Path(out_dir))
        (Path(out_dir) / "learner.json").write_text(json.dumps(self._meta()))

    def load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        from pathlib import Path

        from opdflow.checkpoint import load_learner

        load_learner(self.model, self.opt, Path(ckpt_dir))
        self._restore_meta(
            json.loads((Path(ckpt_dir) / "learner.json").read_text()), ckpt_dir, step
        )

    def _meta(self) -> dict[str, Any]:
        """learner.json: the learner's counters and its record of trained steps."""
        return {
            "version": self.version,
            "bad_steps": self.bad_steps,
            "trained_steps": self.trained_steps,
        }

    def _restore_meta(self, meta: dict[str, Any], ckpt_dir: str, step: int) -> None:
        if meta["version"] != step:
            raise RuntimeError(
                f"checkpoint {ckpt_dir} holds version {meta['version']}, expected {step}"
            )
        self.version, self.bad_steps = step, meta["bad_steps"]
        self.trained_steps = [tuple(x) for x in meta["trained_steps"]]
