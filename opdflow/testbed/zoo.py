"""The embedded tiny teacher and student: built from transformers configs, trained, cached.

No weights are downloaded. One supervised run on the arithmetic task yields the teacher
(its last checkpoint) and the student: an early checkpoint, or the teacher briefly
fine-tuned to drop carries ("carry_blind": a student a few steps from its teacher in
weights, like the paper's base student and its RL-improved teacher). Everything is keyed by
a hash of the recipe, so a changed recipe rebuilds and an unchanged one loads in
milliseconds. A build runs in a child process (build_env); with models.tiny.portable_kernels
its float kernels are pinned there, so one recipe yields the same weights, bit for bit, on
every x86-64 CPU.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opdflow.config import TaskSpec, TinyModelSpec

ZOO_FORMAT = 2  # bump when the build procedure changes
BUILD_THREADS = 2
"""Fixed, not the machine's core count: float reductions then run in the same order on
every machine (with PINNED_KERNELS, that makes one recipe one set of weights everywhere)."""

PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
"""The float kernels a portable build (models.tiny.portable_kernels) computes with on x86-64,
whatever the CPU offers. Torch picks its own kernels (ATen's vector width) and MKL its
matmul code path by instruction set, so unpinned, one recipe trains different models on
AVX2, AVX-512 and AMX CPUs (start held-out KL 0.30 / 0.20 for the demo's recipe on an
AVX2 and an AVX-512 machine). ATen's AVX2 kernels run on every x86-64 CPU made since 2015;
MKL's COMPATIBLE branch (SSE2 code) is the one branch its documentation promises gives the
same results on Intel and non-Intel CPUs (its AVX2 branch is Intel-only). Measured on a
Xeon with AMX, 2 threads, a 128 x 40-token training step of the tiny model: 240 ms
unpinned, 222 ms with ATen at AVX2, 333 ms with MKL's AVX2 branch, 834 ms COMPATIBLE. The
pipeline's own stages are never pinned."""


def build_env(portable: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a build child runs in: `base` (default os.environ) with BUILD_THREADS
    and, when `portable` (on x86-64 only: other CPUs have neither), PINNED_KERNELS."""
    env = dict(os.environ if base is None else base)
    if portable and platform.machine().lower() in ("x86_64", "amd64"):
        env.update(PINNED_KERNELS)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(BUILD_THREADS)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env


@dataclass(frozen=True)
class TinyArtifacts:
    """Paths of one cached build."""

    root: Path
    tokenizer: Path
    student: Path
    teacher: Path
    train: Path
    heldout: Path
    info: dict


def cache_root(cache_dir: str | None) -> Path:
    return Path(cache_dir or os.environ.get("OPDFLOW_CACHE") or Path.home() / ".cache" / "opdflow")


PLANTED_PAIRS = 4
"""Rotary pairs per key head that carry the planted bias: the slowest-turning ones."""


def planted_key_dims(cfg) -> list[int]:
    """Layer-0 key dimensions that take the planted bias: both halves of the PLANTED_PAIRS
    slowest rotary pairs of every key head. They turn by < 0.06 rad over the task's 60
    positions, so a constant there shifts every query's scores by almost the same amount
    (softmax ignores it and training goes on as before), while the large keys it makes lose
    their detail to an FP8 cache's per-tensor scale: the paper's layer-0 key-bias effect."""
    head = cfg.hidden_size // cfg.num_attention_heads
    half = head // 2
    slow = [*range(half - PLANTED_PAIRS, half), *range(head - PLANTED_PAIRS, head)]
    return [h * head + j for h in range(cfg.num_key_value_heads) for j in slow]


def _model_recipe(model: TinyModelSpec) -> dict:
    """The fields that shape this build: a checkpoint student ignores the carry_blind ones
    (so adding those kept every existing build's key); a planted build names its dims."""
    fields = dataclasses.asdict(model)
    if not model.portable_kernels:  # the field came later: unpinned builds kept their keys
        del fields["portable_kernels"]
    if model.key_bias_layer0:  # since the bias moved to planted_key_dims (was: all dims)
        fields["key_bias_dims"] = f"slowest {PLANTED_PAIRS} rotary pairs"
    if model.student == "checkpoint":
        for name in ("student", "carry_blind_share", "carry_blind_steps", "carry_blind_lr"):
            del fields[name]
    else:
        del fields["student_accuracy"]
    return fields


def recipe_key(model: TinyModelSpec, task: TaskSpec) -> str:
    blob = json.dumps(
        {
            "model": _model_recipe(model),
            "task": dataclasses.asdict(task),
            "format": ZOO_FORMAT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_config(spec: TinyModelSpec, vocab_size: int, pad_id: int, eos_id: int):
    """A transformers config for the tiny model (Qwen2 with q/k/v bias, or Llama)."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=256,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        tie_word_embeddings=False,
    )
    if spec.arch == "llama":
        return LlamaConfig(**common, head_dim=spec.hidden_size // spec.num_heads)
    return Qwen2Config(**common)


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


def _train(
    spec: TinyModelSpec, task: TaskSpec, tok, prompts, answers, held, tmp: Path, log
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from opdflow.testbed.task import response_tokens, target_text

    torch.manual_seed(spec.seed)
    cfg = model_config(spec, len(tok), tok.pad_token_id, tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if spec.key_bias_layer0:
        with torch.no_grad():
            model.model.layers[0].self_attn.k_proj.bias[planted_key_dims(cfg)] += (
                spec.key_bias_layer0
            )
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
                model.save_pretrained(tmp / "student", safe_serialization=True)
                info["student"] = {"step": step, "heldout_accuracy": acc}
                log(f"tiny models: student = step {step}, held-out greedy accuracy {acc:.1%}")
    if spec.student == "checkpoint" and "student" not in info:
        raise RuntimeError(
            f"tiny models: no checkpoint reached student_accuracy={spec.student_accuracy} in "
            f"{spec.teacher_steps} steps; raise models.tiny.teacher_steps or lower student_accuracy"
        )
    model.eval()
    acc = greedy_accuracy(model, tok, *held, max_new)
    model.save_pretrained(tmp / "teacher", safe_serialization=True)
    info["teacher"] = {"step": spec.teacher_steps, "heldout_accuracy": acc}
    log(f"tiny models: teacher = step {spec.teacher_steps}, held-out greedy accuracy {acc:.1%}")
    if spec.student == "carry_blind":
        info["student"] = _carry_blind_student(model, spec, tok, prompts, held, max_new, tmp, log)
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
    model, spec: TinyModelSpec, tok, prompts, held, max_new: int, tmp: Path, log
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
    model.save_pretrained(tmp / "student", safe_serialization=True)
    log(
        f"tiny models: student = teacher + {spec.carry_blind_steps} carry-blind steps, "
        f"held-out greedy accuracy {acc:.1%}"
    )
    return {"step": spec.teacher_steps + spec.carry_blind_steps, "heldout_accuracy": acc}


def ensure_tiny(
    model_spec: TinyModelSpec, task_spec: TaskSpec, cache_dir: str | None = None, log=print
) -> TinyArtifacts:
    """Return the cached tiny build for this recipe, building it (a few minutes) if absent."""
    if model_spec.student == "carry_blind" and not task_spec.worked:
        raise ValueError("models.tiny.student='carry_blind' needs data.task.worked=true")
    if model_spec.key_bias_layer0 and model_spec.arch != "qwen2":
        raise ValueError(
            "models.tiny.key_bias_layer0 needs arch='qwen2' (Llama has no k_proj bias)"
        )
    root = cache_root(cache_dir) / f"tiny-{recipe_key(model_spec, task_spec)}"
    if not (root / "build.json").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f"{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build of the same recipe: wait for it
            if not (root / "build.json").is_file():
                _build_in_child(model_spec, task_spec, root, log)
    info = json.loads((root / "build.json").read_text())
    return TinyArtifacts(
        root,
        root / "tokenizer",
        root / "student",
        root / "teacher",
        root / "train.parquet",
        root / "heldout.parquet",
        info,
    )


def _build(model_spec: TinyModelSpec, task_spec: TaskSpec, root: Path, log) -> None:
    import torch

    from opdflow.testbed.task import alphabet, split_problems, write_parquet
    from opdflow.testbed.tokenizer import build_char_tokenizer

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
    torch.set_num_threads(BUILD_THREADS)
    try:
        t0 = time.perf_counter()
        log(f"tiny models: building {root.name} (cached in {root.parent})")
        tok = build_char_tokenizer(alphabet(task_spec.worked), tmp / "tokenizer")
        train, held = split_problems(
            task_spec.num_train, task_spec.num_heldout, task_spec.digits, model_spec.seed
        )
        write_parquet(tmp / "train.parquet", *train)
        write_parquet(tmp / "heldout.parquet", *held)
        info = _train(model_spec, task_spec, tok, *train, held, tmp, log)
        info["build_seconds"] = time.perf_counter() - t0
        info["kernels"] = {
            "torch": torch.__version__,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "threads": torch.get_num_threads(),
        }
        info["model"] = dataclasses.asdict(model_spec)
        info["task"] = dataclasses.asdict(task_spec)
        (tmp / "build.json").write_text(json.dumps(info, indent=2))
        try:
            tmp.rename(root)  # atomic: a concurrent builder that finished first wins
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"tiny models: built in {info['build_seconds']:.0f} s")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _build_in_child(model_spec: TinyModelSpec, task_spec: TaskSpec, root: Path, log) -> None:
    """Run _build in `python -m opdflow.testbed.zoo` under build_env(), relaying its log lines: kernel
    pins only take effect in a process that has not loaded torch yet, and every build runs
    the same way whether pinned or not."""
    spec = json.dumps(
        {"model": dataclasses.asdict(model_spec), "task": dataclasses.asdict(task_spec)}
    )
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "opdflow.testbed.zoo", spec, str(root)],
            env=build_env(model_spec.portable_kernels),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            for line in child.stdout:
                log(line.rstrip("\n"))
        except BaseException:  # interrupted: stop the child too
            child.kill()
            child.wait()
            raise
        if child.wait() != 0:
            err.seek(0)
            tail = "\n".join(err.read().strip().splitlines()[-15:])
            raise RuntimeError(
                f"tiny models: the build of {root.name} failed (exit {child.returncode}):\n{tail}"
            )


def main(argv: list[str]) -> None:
    """`python -m opdflow.testbed.zoo SPEC_JSON ROOT`: one build in this process (_build_in_child)."""
    spec = json.loads(argv[0])
    _build(
        TinyModelSpec(**spec["model"]),
        TaskSpec(**spec["task"]),
        Path(argv[1]),
        lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
