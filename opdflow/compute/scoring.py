"""Per-token log-probabilities of given responses under a model, computed chunk by chunk.

The rescorer, the teacher scorer, the learner and the evaluator all score tokens the
same way (prefill of prompt + response, logits shifted by one), so their numbers differ
only by the weights and precision they use, never by how they were computed.

A full B x T x V logit tensor does not fit at paper scale (16k tokens x 150k vocabulary
is ~10 GB in fp32, and log_softmax plus its gradient several times that). So the model
body runs once for the hidden states, only the response positions are kept, and the
lm_head, log_softmax, gather, entropy and exact KL run `chunk_tokens` tokens at a time:
at most chunk_tokens x V floats (times a small constant) exist at once. The gradient
goes through a custom autograd function that recomputes each chunk's logits in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from opdflow.core import microbatch
from opdflow.core.rollout import RolloutBatch

DEFAULT_CHUNK_TOKENS = 1024
"""Tokens whose full-vocabulary logits are held at once (1024 x 150k fp32 is ~0.6 GB)."""


@dataclass(frozen=True)
class TokenScores:
    """Per-response-token scores, zero where the response mask is False."""

    logp_B_T: torch.Tensor
    """log p(y_t | s_t), float32; carries the gradient when grad is enabled."""
    entropy_B_T: torch.Tensor | None = None
    """Entropy of the next-token distribution in nats, float32, no gradient."""
    kl_B_T: torch.Tensor | None = None
    """Exact KL(ref || model) over the vocabulary in nats, float64, no gradient."""


def batch_tensors(
    batch: RolloutBatch, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """input_ids_B_L, attention_mask_B_L, position_ids_B_L on `device`, and the prompt width P."""
    ids = np.concatenate([batch.prompt_ids_B_P, batch.response_ids_B_T], 1)
    attn = np.concatenate([batch.prompt_mask_B_P, batch.response_mask_B_T], 1)
    ids_t = torch.from_numpy(ids).to(device=device, dtype=torch.long)
    attn_t = torch.from_numpy(attn).to(device=device, dtype=torch.long)
    pos = (attn_t.cumsum(-1) - 1).clamp_min(0)
    return ids_t, attn_t, pos, batch.prompt_ids_B_P.shape[1]


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's parameters live (sharded ones: their local shard's device)."""
    return next(model.parameters()).device


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a DistributedDataParallel-style wrapper (`.module`)."""
    while not hasattr(model, "get_decoder") and isinstance(
        getattr(model, "module", None), torch.nn.Module
    ):
        model = model.module
    return model


def _head(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The lm_head's weight_V_H and bias_V; refuses heads that post-process their logits."""
    inner = _unwrap(model)
    config = inner.config
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1.0):
            raise NotImplementedError(
                f"{config.model_type}: config.{name}={getattr(config, name)!r} transforms the "
                "logits after the lm_head, which chunked scoring does not apply"
            )
    head = inner.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def _response_hidden(
    model: torch.nn.Module, batch: RolloutBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h_N_H (final hidden states, post-norm, predicting each unmasked response token),
    targets_N and the response mask_B_T.

    The model's own forward runs (so a DDP wrapper sees it), with `logits_to_keep=1` so
    its lm_head projects only the last position; a hook on the decoder captures the
    hidden states the lm_head would have read.
    """
    device = model_device(model)
    ids, attn, pos, P = batch_tensors(batch, device)
    T = batch.response_ids_B_T.shape[1]
    mask_B_T = torch.tensor(np.asarray(batch.response_mask_B_T, dtype=bool), device=device)
    h_N_H = response_hidden(model, ids, attn, pos, P, T)[mask_B_T]
    return h_N_H, ids[:, P : P + T][mask_B_T], mask_B_T


def response_hidden(
    model: torch.nn.Module,
    ids_B_L: torch.Tensor,
    attn_B_L: torch.Tensor,
    pos_B_L: torch.Tensor,
    prompt_width: int,
    response_width: int,
) -> torch.Tensor:
    """h_B_T_H: the final hidden states (post-norm) that predict each response position.

    The model's own forward runs (so a DDP or FSDP wrapper sees it), with `logits_to_keep=1`
    so its lm_head projects only the last position; a hook on the decoder captures the
    hidden states the lm_head would have read."""
    captured: list[torch.Tensor] = []

    def keep(_module, _args, out) -> None:
        captured.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    handle = _unwrap(model).get_decoder().register_forward_hook(keep)
    try:
        model(
            input_ids=ids_B_L, attention_mask=attn_B_L, position_ids=pos_B_L, logits_to_keep=1,
            use_cache=False,
        )  # fmt: skip
    finally:
        handle.remove()
    start = prompt_width - 1
    return captured[0][:, start : start + response_width]


def _logits(h: torch.Tensor, weight: torch.Tensor, bias, temperature: float) -> torch.Tensor:
    """Logits of one chunk in at least float32, the lm_head in the model's own precision."""
    z = torch.nn.functional.linear(h, weight, bias)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def _kl(logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(q || p) per row, float64 accumulation, clipped at 0 like `exact_kl_per_token`;
    q(v) = 0 terms (top-p) contribute 0."""
    q = logq.exp()
    diff = torch.where(q > 0, logq - logp, torch.zeros_like(logq))
    return (q * diff).sum(-1, dtype=torch.float64).clamp_min(0.0)


class _ChunkedLogprob(torch.autograd.Function):
    """log_softmax(h W^T + b)[target] chunk by chunk; backward recomputes each chunk.

    Outputs logp_N (differentiable), entropy_N and kl_N (empty unless asked for).
    """

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, chunk, want_entropy, ref, ref_rows):
        N, acc = h.shape[0], torch.promote_types(h.dtype, torch.float32)
        logp = h.new_empty(N, dtype=acc)
        lse = h.new_empty(N, dtype=acc)
        ent = h.new_empty(N if want_entropy else 0, dtype=acc)
        kl = h.new_empty(N if ref is not None else 0, dtype=torch.float64)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            z = _logits(h[s:e], weight, bias, temperature)
            lse[s:e] = z.logsumexp(-1)
            logdist = z.sub_(lse[s:e, None])  # z is not needed again: reuse its memory
            logp[s:e] = logdist.gather(-1, targets[s:e, None]).squeeze(-1)
            if want_entropy:
                ent[s:e] = -(logdist.exp() * logdist).sum(-1)
            if ref is not None:
                kl[s:e] = _kl(torch.from_numpy(ref[ref_rows[s:e]]).to(h.device).float(), logdist)
            del z, logdist
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent, kl)
        return logp, ent, kl

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent, _grad_kl):
        h, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        acc = lse.dtype
        grad_w = torch.zeros_like(weight, dtype=acc) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=acc) if need_b else None
        N, chunk = h.shape[0], ctx.chunk
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            g = grad_logp[s:e].to(acc)
            # d logp / d z = onehot(target) - softmax(z), z = (h W^T + b) / temperature
            dz = _logits(h[s:e], weight, bias, ctx.temperature).sub_(lse[s:e, None]).exp_()
            dz.mul_(-g[:, None]).scatter_add_(-1, targets[s:e, None], g[:, None])
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)
            if need_h:
                grad_h[s:e] = (dz.to(weight.dtype) @ weight).to(h.dtype)
            if need_w:
                grad_w.addmm_(dz.t(), h[s:e].to(acc))
            if need_b:
                grad_b += dz.sum(0)
            del dz
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _scatter(values_N: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """values of the unmasked tokens back into a zero-filled B x T tensor (differentiable)."""
    flat = values_N.new_zeros(mask_B_T.numel())
    index = mask_B_T.reshape(-1).nonzero().squeeze(-1)
    return flat.index_put((index,), values_N).reshape(mask_B_T.shape)


def head_logprobs(
    model: torch.nn.Module,
    h_N_H: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    entropy: bool = False,
    ref: np.ndarray | None = None,
    ref_rows: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logp_N of `targets_N` under the model's lm_head applied to h_N_H, `chunk_tokens` rows
    at a time (differentiable; backward recomputes each chunk), with entropy_N and the exact
    KL(ref || model)_N against `ref[ref_rows]` (empty unless asked for)."""
    weight, bias = _head(model)
    return _ChunkedLogprob.apply(
        h_N_H, weight, bias, targets_N, temperature, chunk_tokens, entropy, ref, ref_rows
    )


def score_tokens(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
    ref_logdist_B_T_V: np.ndarray | torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> TokenScores:
    """logp_B_T of the response tokens, and optionally the entropy and the exact
    KL(ref || model) against a given log-distribution (e.g. the engine's), chunk by chunk."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens!r}: must be a positive number of tokens")
    h_N_H, targets_N, mask_B_T = _response_hidden(model, batch)
    ref, rows = None, None
    if ref_logdist_B_T_V is not None:
        ref = np.asarray(ref_logdist_B_T_V)  # numpy: read-only Ray arrays stay uncopied
        ref = ref.reshape(-1, ref.shape[-1])  # (B*T) x V view; each chunk copies its rows
        rows = mask_B_T.reshape(-1).nonzero().squeeze(-1).cpu().numpy()
    logp_N, ent_N, kl_N = head_logprobs(
        model, h_N_H, targets_N, temperature, chunk_tokens, entropy, ref, rows
    )
    return TokenScores(
        _scatter(logp_N, mask_B_T),
        _scatter(ent_N, mask_B_T) if entropy else None,
        _scatter(kl_N, mask_B_T) if ref is not None else None,
    )


@torch.no_grad()
def exact_kl_between(
    model_q: torch.nn.Module,
    model_p: torch.nn.Module,
    batch: RolloutBatch,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Exact KL(q || p) over the vocabulary at each response position (float64 B x T,
    zero where masked), two models' logits compared chunk by chunk at temperature 1."""
    hq_N_H, _, mask_B_T = _response_hidden(model_q, batch)
    hp_N_H, _, _ = _response_hidden(model_p, batch)
    return _scatter(heads_kl(model_q, model_p, hq_N_H, hp_N_H, chunk_tokens), mask_B_T)


@torch.no_grad()
def heads_kl(
    model_q: torch.nn.Module,
    model_p: torch.nn.Module,
    hq_N_H: torch.Tensor,
    hp_N_H: torch.Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Exact KL(q || p)_N (float64) between two lm_heads applied to their hidden states,
    `chunk_tokens` rows at a time at temperature 1."""
    (wq, bq), (wp, bp) = _head(model_q), _head(model_p)
    kl_N = torch.empty(hq_N_H.shape[0], dtype=torch.float64, device=hq_N_H.device)
    for s in range(0, hq_N_H.shape[0], chunk_tokens):
        e = s + chunk_tokens
        logq = torch.log_softmax(_logits(hq_N_H[s:e], wq, bq, 1.0), -1)
        logp = torch.log_softmax(_logits(hp_N_H[s:e], wp, bp, 1.0), -1)
        kl_N[s:e] = _kl(logq, logp)
    return kl_N


def token_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    want_logdist: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp_B_T of each response token (float32, grad if enabled), chunked.

    want_logdist=True instead runs the unchunked reference and also returns the full
    logdist_B_T_V: B x T x V floats, for tests and small vocabularies only.
    """
    if not want_logdist:
        return score_tokens(model, batch, temperature, chunk_tokens=chunk_tokens).logp_B_T, None
    device = model_device(model)
    ids, attn, pos, P = batch_tensors(batch, device)
    T = batch.response_ids_B_T.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    logits_B_T_V = logits[:, P - 1 : P - 1 + T].float()
    if temperature != 1.0:
        logits_B_T_V = logits_B_T_V / temperature
    logdist_B_T_V = torch.log_softmax(logits_B_T_V, dim=-1)
    target = ids[:, P : P + T]
    logp_B_T = logdist_B_T_V.gather(-1, target[..., None]).squeeze(-1)
    mask = torch.tensor(np.asarray(batch.response_mask_B_T, dtype=bool), device=device)
    logp_B_T = torch.where(mask, logp_B_T, torch.zeros_like(logp_B_T))
    return logp_B_T, logdist_B_T_V


@dataclass(frozen=True)
class BatchScores:
    """score_batch's result, in host memory: B x T float arrays, zero where masked."""

    logp_B_T: np.ndarray
    """log p(y_t | s_t), float32."""
    kl_B_T: np.ndarray | None = None
    """Exact KL(engine || model) over the vocabulary (where the batch carries the engine's
    full log-distributions), float64."""


@torch.no_grad()
def score_batch(
    model: torch.nn.Module,
    batch: RolloutBatch,
    budget: int,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> BatchScores:
    """score_tokens over a whole batch in micro-batches of at most `budget` padded tokens
    (0: one pass), results moved to host memory once per micro-batch.

    The exact KL is computed against `batch.logdist_engine_B_T_V` when the batch has it."""
    B, T = batch.response_ids_B_T.shape
    logp = np.zeros((B, T), np.float32)
    exact = batch.logdist_engine_B_T_V is not None
    kl = np.zeros((B, T), np.float64) if exact else None
    for rows in microbatch.of_batch(batch, budget):
        mb = batch.select(rows)
        s = score_tokens(
            model, mb, temperature, ref_logdist_B_T_V=mb.logdist_engine_B_T_V,
            chunk_tokens=chunk_tokens,
        )  # fmt: skip
        width = mb.response_ids_B_T.shape[1]
        logp[rows, :width] = s.logp_B_T.float().cpu().numpy()
        if kl is not None:
            kl[rows, :width] = s.kl_B_T.cpu().numpy()
    return BatchScores(logp, kl)


@torch.no_grad()
def exact_kl_batch(
    model_q: torch.nn.Module,
    model_p: torch.nn.Module,
    batch: RolloutBatch,
    budget: int,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> np.ndarray:
    """exact_kl_between over a whole batch in micro-batches of at most `budget` padded
    tokens; float64 B x T in host memory."""
    B, T = batch.response_ids_B_T.shape
    kl = np.zeros((B, T), np.float64)
    for rows in microbatch.of_batch(batch, budget):
        mb = batch.select(rows)
        kl[rows, : mb.response_ids_B_T.shape[1]] = (
            exact_kl_between(model_q, model_p, mb, chunk_tokens).cpu().numpy()
        )
    return kl
