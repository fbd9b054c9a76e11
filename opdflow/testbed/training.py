"""Training the tiny teacher and student: the supervised loop a tiny build runs.

One supervised run on the arithmetic task (next-token cross-entropy on the answer tokens,
warm-up and cosine decay) yields the teacher; the student is an early checkpoint of that
run, or the teacher briefly fine-tuned to drop carries. zoo.py initialises the model and
caches what this saves. The cache key (zoo.recipe_key) hashes the recipe, not this code:
a change here that changes the weights a recipe yields must bump zoo.ZOO_FORMAT.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from opdflow.config import TaskSpec, TinyModelSpec


def _encode(tok, prompts: list[str], targets: list[str]):
    """Right-padded prompt+target+EOS ids and a loss mask on target and EOS tokens."""
    import torch

    rows, masks = [], []
    for p, a in zip(prompts, targets):
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        a_ids = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(p_ids + a_ids)
        masks.append([0] * len(p_ids) + [1] * len(a_ids))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
    return ids, loss_mask


def greedy_accuracy(model, tok, prompts: list[str], answers: list[str], max_new: int) -> float:
    """Exact-match accuracy of greedy answers (a quick build-time check)."""
    import torch

    from opdflow.testbed.task import is_correct

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            pos = (attn.cumsum(-1) - 1).clamp_min(0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1]
            nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
            out.append(nxt)
            done |= nxt == tok.eos_token_id
            ids = torch.cat([ids, nxt[:, None]], 1)
            attn = torch.cat([attn, (~done | (nxt == tok.eos_token_id)).long()[:, None]], 1)
    gen = torch.stack(out, 1)
    texts = [
        tok.decode([t for t in row.tolist() if t not in (tok.pad_token_id, tok.eos_token_id)])
        for row in gen
    ]
    return sum(is_correct(t, a) for t, a in zip(texts, answers)) / len(answers)


def train_teacher_and_student(
    model, spec: TinyModelSpec, task: TaskSpec, tok, prompts, answers, held, out: Path, log
) -> dict:
    """Train the freshly initialised `model` into the teacher on (prompts, answers) and save
    the teacher and the student under `out`: the student is the first checkpoint whose
    held-out greedy accuracy reaches spec.student_accuracy ("checkpoint"), or the teacher
    fine-tuned to drop carries ("carry_blind"). Returns what build.json records of both."""
    import torch

    from opdflow.testbed.task import response_tokens, target_text

    ids, loss_mask = _encode(
        tok, prompts, [target_text(p, a, task.worked) for p, a in zip(prompts, answers)]
    )
    max_new = response_tokens(task.digits, task.worked)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed)
    info: dict = {}
    t0 = time.perf_counter()
    for step in range(1, spec.teacher_steps + 1):
        warm = min(1.0, step / 50)
        decay = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / spec.teacher_steps))
        for g in opt.param_groups:
            g["lr"] = spec.lr * warm * decay
        loss = _sft_step(model, opt, ids, loss_mask, spec, gen)
        if step % 100 == 0:
            log(f"tiny models: step {step}/{spec.teacher_steps} loss {loss:.3f}")
        if spec.student == "checkpoint" and "student" not in info and step % 25 == 0:
            model.eval()
            acc = greedy_accuracy(model, tok, *held, max_new)
            model.train()
            if acc >= spec.student_accuracy:
                model.save_pretrained(out / "student", safe_serialization=True)
                info["student"] = {"step": step, "heldout_accuracy": acc}
                log(f"tiny models: student = step {step}, held-out greedy accuracy {acc:.1%}")
    if spec.student == "checkpoint" and "student" not in info:
        raise RuntimeError(
            f"tiny models: no checkpoint reached student_accuracy={spec.student_accuracy} in "
            f"{spec.teacher_steps} steps; raise models.tiny.teacher_steps or lower student_accuracy"
        )
    model.eval()
    acc = greedy_accuracy(model, tok, *held, max_new)
    model.save_pretrained(out / "teacher", safe_serialization=True)
    info["teacher"] = {"step": spec.teacher_steps, "heldout_accuracy": acc}
    log(f"tiny models: teacher = step {spec.teacher_steps}, held-out greedy accuracy {acc:.1%}")
    if spec.student == "carry_blind":
        info["student"] = _carry_blind_student(model, spec, tok, prompts, held, max_new, out, log)
    info["train_seconds"] = time.perf_counter() - t0
    return info


def _sft_step(model, opt, ids, loss_mask, spec: TinyModelSpec, gen) -> float:
    """One supervised step on a random batch (next-token cross-entropy on the masked tokens)."""
    import torch

    idx = torch.randint(0, ids.shape[0], (spec.batch_size,), generator=gen)
    x, m = ids[idx], loss_mask[idx]
    logits = model(input_ids=x).logits[:, :-1]
    target, tmask = x[:, 1:], m[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits[tmask], target[tmask], label_smoothing=spec.label_smoothing
    )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def _carry_blind_student(
    model, spec: TinyModelSpec, tok, prompts, held, max_new: int, out: Path, log
) -> dict:
    """Fine-tune the (saved) teacher in place into the student: carry_blind_share of the
    targets drop their carries, the rest stay right."""
    import numpy as np
    import torch

    from opdflow.testbed.task import carry_blind_solution, worked_solution

    blind = np.random.default_rng(spec.seed + 1).random(len(prompts)) < spec.carry_blind_share
    targets = [carry_blind_solution(p) if b else worked_solution(p) for p, b in zip(prompts, blind)]
    ids, loss_mask = _encode(tok, prompts, targets)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.carry_blind_lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    model.train()
    for _ in range(spec.carry_blind_steps):
        _sft_step(model, opt, ids, loss_mask, spec, gen)
    model.eval()
    acc = greedy_accuracy(model, tok, *held, max_new)
    model.save_pretrained(out / "student", safe_serialization=True)
    log(
        f"tiny models: student = teacher + {spec.carry_blind_steps} carry-blind steps, "
        f"held-out greedy accuracy {acc:.1%}"
    )
    return {"step": spec.teacher_steps + spec.carry_blind_steps, "heldout_accuracy": acc}
