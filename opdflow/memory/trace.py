"""Traced peaks: a learner step and a scoring prefill on fake tensors, measured by torch.

No formula here: the student is built from its shape as the learner builds it (meta
device, activation checkpointing, FSDP2 wrapping from compute/fsdp.py over a fake process
group of the learner's world size), on FakeTensorMode's CPU device, which allocates
nothing; then micro-batches of the planned size run through the project's own scoring
code (compute/scoring.py: the hidden states, the chunked lm_head and its recomputing
backward) with torch.distributed._tools' memory trackers (FSDPMemTracker for a sharded
learner, MemTracker otherwise) recording every tensor's bytes by category. torchtitan's
memory estimation works the same way.

One micro-batch is traced, beside a full set of gradients when the rank runs more than one
(every micro-batch after the first runs beside the gradients accumulated so far); AdamW's two FP32 moments, which exist from the
first optimizer step on, are added exactly (two copies of each parameter shard). The
optimizer step itself is traced on plain tensors of the shards' shapes (AdamW over fake
DTensors over-counts its temporaries): foreach on a GPU (one temporary per parameter
shard), one tensor at a time on a CPU.

A 7B model traced whole takes tens of seconds; its decoder layers are identical, so a model
of more than `BASE[1]` layers is traced with `BASE[0]` and `BASE[1]` layers and each part
extrapolated linearly per layer (tests/unit/test_memory_plan.py checks this equals the
whole trace). Attention masks are materialised under fake tensors (transformers cannot
tell an unpadded batch there), which is what a padded micro-batch costs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from opdflow.memory.shape import ModelShape

BASE = (3, 4)
"""Decoder layers of the two traced models a deeper learner's parts are extrapolated from
(FSDP2's prefetching settles from three layers on)."""
PREFILL_BASE = (2, 3)
"""The same for a prefill (its transient memory is the same from two layers on)."""

LEARNER_PARTS = ("parameters", "gradients", "optimizer", "gathered", "activations")
"""A learner step's parts: FP32 master weights, FP32 gradients, AdamW moments (this rank's
shards), parameters all-gathered for compute, and the rest of a micro-batch's transient
memory (saved activations, recomputation, logits chunks, reduce-scatter buffers) or, at the
optimizer step, its temporaries."""


@dataclass(frozen=True)
class StepSetting:
    """What a learner rank runs in one step, as the memory plan traces it."""

    world: int
    """Ranks of the learner (each holds 1/world of the sharded state)."""
    sharded: bool
    """FSDP2 (a GPU learner, or more than one rank) or one plain FP32 module."""
    compute_dtype: str
    """"bfloat16" or "float32": the dtype parameters are gathered and multiplied in."""
    activation_checkpointing: bool
    rows: int
    """Responses in this rank's largest micro-batch."""
    prompt: int
    """Padded prompt tokens of a row."""
    response: int
    """Padded response tokens of a row."""
    micro_batches: int
    """Micro-batches this rank runs per step (more than one: the traced one runs beside
    a full set of gradients)."""
    chunk: int
    """train.logit_chunk_tokens."""
    foreach: bool
    """AdamW's foreach kernels (the default on GPUs)."""
    gloo: bool = False
    """The collectives run on gloo (a sharded CPU learner): it copies each reduce-scatter's
    input and each all-gather's output into buffers of its own (NCCL works in place)."""


def _dtype(name: str):
    import torch

    return getattr(torch, name)


@contextlib.contextmanager
def _fake_world(world: int) -> Iterator[object]:
    """A device mesh over a fake process group of `world` ranks (this process is rank 0)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError(
            "the memory plan traces on a fake process group: run it in a process that has "
            "not joined one (before the learner starts)"
        )
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _quiet_module_tracking() -> Iterator[None]:
    """The trackers' module tracking warns that its hierarchy "may be messed up": the scoring
    code reads the hidden states through a hook and never backpropagates through the root's
    own output, so the root's backward hooks do not run. Only per-module figures suffer;
    the plan reads the global peak, which counts every tensor."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The module hierarchy tracking", UserWarning)
        yield


def _student(shape: ModelShape, setting: StepSetting, mesh: object | None):
    """The student as the learner builds it, on fake tensors (call under FakeTensorMode)."""
    import torch
    from transformers import AutoModelForCausalLM

    from opdflow.compute.fsdp import enable_activation_checkpointing, shard

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.hf_config(), dtype=torch.float32)
    if setting.activation_checkpointing:
        enable_activation_checkpointing(model)
    if setting.sharded:
        shard(model, mesh, _dtype(setting.compute_dtype))
        model.to_empty(device="cpu")
    else:
        _materialize(model)
    return model.train()


def _materialize(model) -> None:
    """Give a meta-device module fake CPU storage (to_empty cannot swap plain parameters
    for fake ones)."""
    import torch

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad
                )
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype)


def _inputs(rows: int, prompt: int, response: int):
    """input_ids, attention_mask and position_ids of `rows` full-length rows."""
    import torch

    length = prompt + response
    ids = torch.zeros(rows, length, dtype=torch.long)
    attn = torch.ones(rows, length, dtype=torch.long)
    pos = torch.arange(length).expand(rows, length)
    return ids, attn, pos


def _response_tokens(model, rows: int, prompt: int, response: int):
    """h_N_H and targets_N of every response token (a copy, as the learner's mask index)."""
    import torch

    from opdflow.compute.scoring import response_hidden

    ids, attn, pos = _inputs(rows, prompt, response)
    h_B_T_H = response_hidden(model, ids, attn, pos, prompt, response)
    every = torch.arange(response)  # an index, not a slice: copies, as a boolean mask does
    h_N_H = h_B_T_H[:, every].reshape(rows * response, -1)
    return h_N_H, ids[:, prompt : prompt + response].reshape(-1)


def _learner_micro_batch(model, setting: StepSetting) -> None:
    """One micro-batch's forward and backward, as Learner._scores runs it."""
    from opdflow.compute.scoring import head_logprobs

    h_N_H, targets_N = _response_tokens(model, setting.rows, setting.prompt, setting.response)
    logp_N, _, _ = head_logprobs(model, h_N_H, targets_N, 1.0, setting.chunk, entropy=True)
    (-logp_N.sum()).backward()


def _category(name: str) -> str:
    """A tracker category (FSDPMemTracker's or MemTracker's) as a learner part."""
    return {
        "Sharded Param": "parameters", "Parameter": "parameters",
        "Sharded Grad": "gradients", "Gradient": "gradients",
        "Optstate": "optimizer", "OptState": "optimizer",
        "Unsharded Param": "gathered", "All Gather": "gathered",
    }.get(name, "activations")  # fmt: skip


def _parts(snapshot: dict) -> dict[str, int]:
    out = dict.fromkeys(LEARNER_PARTS, 0)
    for device_snap in snapshot.values():
        for key, value in device_snap.items():
            name = getattr(key, "value", key)
            if name != "Total":
                out[_category(name)] += int(value)
    return out


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def learner_step(
    shape: ModelShape, setting: StepSetting, base: tuple[int, int] = BASE
) -> dict[str, dict[str, int]]:
    """The learner rank's step memory by part (bytes) at the peak of each phase, "micro-batch"
    (a forward and backward) and "optimizer step", traced with `base` layers and
    extrapolated (by_layers)."""
    return by_layers(shape, lambda s: _learner_step(s, setting), base)


def _learner_step(shape: ModelShape, setting: StepSetting) -> dict[str, dict[str, int]]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_module_tracking())
        mesh = stack.enter_context(_fake_world(setting.world)) if setting.sharded else None
        with FakeTensorMode():
            model = _student(shape, setting, mesh)
            shards = [_local(p) for p in model.parameters()]
            if setting.micro_batches > 1:  # a later micro-batch runs beside the gradients
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
            if setting.sharded:
                from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

                tracker = FSDPMemTracker(model)
            else:
                from torch.distributed._tools.mem_tracker import MemTracker

                tracker = MemTracker()
                tracker.track_external(model)
            buffers = _gloo_buffers() if setting.gloo else contextlib.nullcontext()
            with tracker, buffers:
                _learner_micro_batch(model, setting)
            micro = _parts(tracker.get_tracker_snapshot("peak"))
            optimizer = 2 * sum(p.numel() * p.element_size() for p in shards)
            micro["optimizer"] += optimizer  # AdamW's moments, there from the first step on
            step = _optimizer_step(shards, setting.foreach)
    return {"micro-batch": micro, "optimizer step": step}


def _gloo_buffers():
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class GlooBuffers(TorchDispatchMode):
        """gloo's own buffers, which no tracker sees: allocated for the time of each
        reduce-scatter (a copy of its input) and all-gather (a copy of its output), so the
        tracker beneath this mode counts them (measured: a 128 MB reduce-scatter over gloo
        raises the resident set by 127 MB, an all-gather into 128 MB by 250)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            import torch

            if any(t is DTensor for t in types):
                return NotImplemented  # let DTensor desugar into local ops first
            copied = {
                torch.ops.c10d._reduce_scatter_base_.default: 1,
                torch.ops.c10d._allgather_base_.default: 0,
            }.get(func)
            buffer = torch.empty_like(args[copied]) if copied is not None else None
            out = func(*args, **(kwargs or {}))
            del buffer
            return out

    return GlooBuffers()


def _optimizer_step(shards: list, foreach: bool) -> dict[str, int]:
    """AdamW's step on plain tensors shaped as this rank's shards: parameters, gradients,
    moments and the step's temporaries (as "activations"), at its peak."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    params = [torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype)) for p in shards]
    for p in params:
        p.grad = torch.empty_like(p)
    opt = torch.optim.AdamW(params, lr=1e-6, foreach=foreach)
    opt.step()  # the moments exist from here on
    tracker = MemTracker()
    tracker.track_external(*params, *(p.grad for p in params), opt)
    with tracker:
        opt.step()
    total = int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    weights = sum(p.numel() * p.element_size() for p in params)
    return {
        "parameters": weights,
        "gradients": weights,
        "optimizer": 2 * weights,
        "gathered": 0,
        "activations": max(total - 4 * weights, 0),
    }


def prefill(
    shape: ModelShape,
    rows: int,
    prompt: int,
    response: int,
    chunk: int,
    models: int = 1,
    base: tuple[int, int] = PREFILL_BASE,
) -> dict[str, int]:
    """A BF16 scorer's peak (bytes) by part, "weights" and "prefill": one micro-batch scored
    without gradients as score_batch runs it (models=1: the rescorer, the teacher), or two
    models' hidden states and their exact KL as exact_kl_batch runs it (models=2: the
    evaluator's student and teacher)."""
    trace = by_layers(
        shape,
        lambda s: {"prefill": _prefill(s, rows, prompt, response, chunk, models)},
        base,
    )
    return trace["prefill"]


def _prefill(
    shape: ModelShape, rows: int, prompt: int, response: int, chunk: int, models: int
) -> dict[str, int]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    from opdflow.compute.scoring import head_logprobs, heads_kl

    with FakeTensorMode():
        built = []
        for _ in range(models):
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(shape.hf_config(), dtype=torch.bfloat16)
            _materialize(model)
            built.append(model.eval())
        tracker = MemTracker()
        tracker.track_external(*built)
        weights = sum(p.numel() * p.element_size() for m in built for p in m.parameters())
        with tracker, torch.no_grad(), _quiet_module_tracking():
            hidden = [_response_tokens(m, rows, prompt, response) for m in built]
            if models == 1:
                head_logprobs(built[0], hidden[0][0], hidden[0][1], 1.0, chunk)
            else:
                heads_kl(built[0], built[1], hidden[0][0], hidden[1][0], chunk)
            del hidden
        total = int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    return {"weights": weights, "prefill": max(total - weights, 0)}


Phases = dict[str, dict[str, int]]
"""Bytes by part at the peak of each phase of a trace."""


def by_layers(
    shape: ModelShape, trace: Callable[[ModelShape], Phases], base: tuple[int, int] = BASE
) -> Phases:
    """`trace` of the whole model, or of `base` layers extrapolated per layer for a deeper
    one: part(n) = part(a) + (n - a) * (part(b) - part(a)), (a, b) = base, in every phase
    (traced whole while that is no more work: n <= a + b)."""
    a, b = base
    if shape.layers <= a + b:
        return trace(shape)
    at_a, at_b = trace(shape.with_layers(a)), trace(shape.with_layers(b))
    n = shape.layers
    return {
        phase: {k: at_a[phase][k] + (n - a) * (at_b[phase][k] - at_a[phase][k]) for k in parts}
        for phase, parts in at_a.items()
    }
