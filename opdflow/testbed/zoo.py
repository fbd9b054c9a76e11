"""The embedded tiny teacher and student: built from transformers configs, trained, cached.

No weights are downloaded. One supervised run on the arithmetic task (training.py) yields
the teacher (its last checkpoint) and the student: an early checkpoint, or the teacher
briefly fine-tuned to drop carries ("carry_blind": a student a few steps from its teacher
in weights, like the paper's base student and its RL-improved teacher). Everything is
keyed by a hash of the recipe, so a changed recipe rebuilds and an unchanged one loads in
milliseconds; the key holds ZOO_FORMAT, not the code, so moving code keeps every cached
build. A build runs in a child process (build_env); with models.tiny.portable_kernels
its float kernels are pinned there, so one recipe yields the same weights, bit for bit, on
every x86-64 CPU.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opdflow.config import TaskSpec, TinyModelSpec
from opdflow.testbed.training import train_teacher_and_student

ZOO_FORMAT = 2
"""Part of every recipe key: bump it when the build procedure (here or in training.py)
changes the weights a recipe yields, so cached builds of the old procedure are not reused."""
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


def _init_model(spec: TinyModelSpec, tok):
    """The untrained tiny model, seeded by spec.seed, with its planted layer-0 key bias."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    cfg = model_config(spec, len(tok), tok.pad_token_id, tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if spec.key_bias_layer0:
        with torch.no_grad():
            model.model.layers[0].self_attn.k_proj.bias[planted_key_dims(cfg)] += (
                spec.key_bias_layer0
            )
    return model


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


def build(
    model_spec: TinyModelSpec, task_spec: TaskSpec, root: Path, log: Callable[[str], None]
) -> None:
    """Build one recipe's task, tokenizer, teacher and student into `root`, atomically (a
    temporary directory renamed into place), in this process; ensure_tiny runs it in a child
    process (_build_in_child) so that build_env()'s threads and kernel pins take effect."""
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
        model = _init_model(model_spec, tok)
        info = train_teacher_and_student(model, model_spec, task_spec, tok, *train, held, tmp, log)
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
    """Run build in `python -m opdflow.testbed.zoo` under build_env(), relaying its log lines: kernel
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
    build(
        TinyModelSpec(**spec["model"]),
        TaskSpec(**spec["task"]),
        Path(argv[1]),
        lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
