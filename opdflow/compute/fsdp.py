"""The learner's student as FSDP2 shards: built on the meta device, loaded shard by shard.

A 7B student in FP32 with AdamW is ~112 GB of weights, gradients and moments: no rank can
hold it whole, not even for a moment at start. So the model is built on the meta device
(shapes, no memory), every decoder layer and then the root are `fully_shard`ed over the
learner's ranks, storage is allocated only for each rank's shard (`to_empty`), and each
rank reads from the checkpoint's safetensors files only the rows of each tensor it owns
(safetensors slices are read lazily from the memory-mapped file). FP32 shards are the
master weights; a mixed-precision policy all-gathers them in the compute dtype (bf16 on
GPUs) and reduce-scatters gradients in FP32. Gradients are summed over ranks, not
averaged: the loss is already normalised by the whole batch's tokens.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DistSpec:
    """Where a learner rank sits in its torch.distributed group."""

    rank: int
    world: int
    init_method: str
    """Rendezvous, e.g. "tcp://10.0.0.1:29500" (rank 0's node and a free port)."""
    host: str = ""
    """This rank's node address (Ray's): the group's sockets bind the interface holding it,
    not the one the hostname resolves to (interfaces.py); "" = the backend's own choice."""


def free_port(host: str = "") -> int:
    """A TCP port free on this machine right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_backend(device: torch.device) -> str:
    """The learner group's collective backend: NCCL on GPUs, gloo on CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(device: torch.device, spec: DistSpec | None) -> DistSpec:
    """Join (or, alone, create) the learner's process group: NCCL on GPUs, gloo on CPUs,
    its sockets (gloo's, NCCL's bootstrap) on the interface of the rank's node address."""
    import torch.distributed as dist

    from opdflow.compute.interfaces import bind_sockets

    if spec is None:
        spec = DistSpec(0, 1, f"tcp://127.0.0.1:{free_port('127.0.0.1')}")
    if not dist.is_initialized():
        backend = group_backend(device)
        if spec.host:
            bind_sockets(backend, spec.host)
        dist.init_process_group(
            backend, init_method=spec.init_method, rank=spec.rank, world_size=spec.world
        )
    return spec


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (model.model.layers), if any."""
    return list(getattr(getattr(model, "model", None), "layers", []))


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them
    (transformers' per-layer checkpointing, non-reentrant: it composes with FSDP2)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.25
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_sharded(
    model_path: str,
    device: torch.device,
    world: int,
    compute_dtype: torch.dtype,
    activation_checkpointing: bool,
) -> torch.nn.Module:
    """The student in FP32 shards over `world` ranks (the process group must exist), each
    rank loading only its own rows from the safetensors files; in train mode."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    shard(model, init_device_mesh(device.type, (world,)), compute_dtype)
    model.to_empty(device=device)
    _rebuild_buffers(model, device)
    load_shards(model, model_path)
    return model.train()


def shard(model: torch.nn.Module, mesh: object, compute_dtype: torch.dtype) -> None:
    """FSDP2 over `mesh`, as the learner shards its student (the memory plan traces this
    same wrapping): each decoder layer, then the root (embeddings, final norm, head), FP32
    shards all-gathered in `compute_dtype`, gradients reduced in FP32 and summed over ranks."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # embeddings, final norm, head
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum over ranks ...
            module.set_force_sum_reduction_for_comms(True)  # ... as a plain SUM (gloo has no AVG)


def _rebuild_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary inv_freq) are not in any checkpoint and were left
    uninitialised on meta: recompute them by building their module again from its config."""
    for name, module in model.named_modules():
        names = [
            b for b in getattr(module, "_non_persistent_buffers_set", ()) if b in module._buffers
        ]
        if not names:
            continue
        try:
            fresh = type(module)(module.config)
        except (AttributeError, TypeError) as exc:
            raise NotImplementedError(
                f"{name} ({type(module).__name__}) has non-persistent buffers {names} that "
                "cannot be rebuilt after meta-device construction (its constructor does not "
                "take the model config)"
            ) from exc
        for b in names:
            module._buffers[b] = fresh._buffers[b].to(device)


def _tensor_files(model_path: str) -> dict[str, Path]:
    """Which safetensors file holds each tensor (the index if sharded, else the file's keys)."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {k: root / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    where: dict[str, Path] = {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            where.update(dict.fromkeys(st.keys(), f))
    return where


def load_shards(model: torch.nn.Module, model_path: str) -> None:
    """Copy into every parameter and persistent buffer the rows this rank owns, read from the
    checkpoint's safetensors files (only those bytes are read), cast to the model's dtype."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    files = _tensor_files(model_path)
    targets = dict(model.named_parameters())
    targets.update(
        (n, b)
        for n, b in model.named_buffers()
        if n.rsplit(".", 1)[-1] not in _non_persistent(model, n)
    )
    missing = sorted(n for n in targets if n not in files)
    if missing:
        raise KeyError(
            f"{model_path}: no tensor {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
            "in its safetensors files; the sharded loader reads tensors under the names "
            "transformers gives them (a checkpoint saved with save_pretrained)"
        )
    handles: dict[Path, object] = {}  # one open (memory-mapped) file per shard file
    with torch.no_grad():
        for name, tensor in targets.items():
            if isinstance(tensor, DTensor):
                local = tensor.to_local()
                shape, offset = compute_local_shape_and_global_offset(
                    tensor.shape, tensor.device_mesh, tensor.placements
                )
            else:
                local, shape, offset = tensor, tuple(tensor.shape), (0,) * tensor.dim()
            if local.numel() == 0:
                continue  # more ranks than rows: this rank holds none of this tensor
            f = files[name]
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            rows = handles[f].get_slice(name)
            if tuple(rows.get_shape()) != tuple(tensor.shape):
                raise ValueError(
                    f"{model_path}: tensor {name} has shape {tuple(rows.get_shape())} in "
                    f"{f.name} but the config builds {tuple(tensor.shape)}"
                )
            part = rows[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
            local.copy_(part.reshape(local.shape))


def _non_persistent(model: torch.nn.Module, buffer_name: str) -> set[str]:
    owner = model.get_submodule(buffer_name.rsplit(".", 1)[0]) if "." in buffer_name else model
    return set(getattr(owner, "_non_persistent_buffers_set", ()))
