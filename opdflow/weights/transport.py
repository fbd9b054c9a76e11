"""How a weights version's bytes reach its consumers: the object store, or a collective.

Either way a version is one ObjectRef the driver holds (its place in the version bound,
inside a `weights.WeightsRef`) that resolves to a `weights.WeightsHandle` once the version
is complete, and the learner's step loses only the FP32 -> BF16 cast into a buffer it
reuses, run beside its next step (cast.py):

- object_store: a thread of the learner actor `ray.put`s the cast buffer while the next
  step trains (publisher.py); a consumer's get is zero-copy and `weights.load_module`
  copies the views into its model (fetcher.py).
- collective: the learner keeps the cast buffer on its device while the driver says the
  version may still be needed; the object store holds only the handle. Each consumer end
  receives it on its own 2-rank group with the learner (pairs.py: NCCL between GPUs, gloo
  on CPUs; nothing goes through host memory on GPUs).

Why not Ray Direct Transport (ray 2.60, alpha): it works here once the receiving actor
also declares `enable_tensor_transport=True` (without it the transfer deadlocks and times
out after 60 s), but an actor may be in only one collective group per backend, its groups
are static (a restarted or added consumer means tearing the group down everywhere), its
torch_gloo group reuses the process's default process group (the data-parallel learner's
FSDP group) and its NCCL groups need cupy.
"""

from __future__ import annotations

from collections.abc import Iterable


def resolve(transport: str, learner_gpus: float, consumer_gpus: Iterable[float]) -> str:
    """The transport a run uses: "auto" is collective when the learner and every consumer
    have a GPU (NCCL needs both ends on one), else the object store."""
    if transport != "auto":
        return transport
    on_gpus = learner_gpus > 0 and all(g > 0 for g in consumer_gpus)
    return "collective" if on_gpus else "object_store"
