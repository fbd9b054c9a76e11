"""How weights versions travel from the learner to the stages that read them."""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import one_of, positive


@dataclass
class WeightsConfig:
    """How each new weights version moves from the learner to the generators, the rescorer
    and the evaluator. Either way a version is an ObjectRef the controller holds (at most
    k + 2 live) and the learner's step waits only for its FP32 -> BF16 cast."""

    transport: str = "auto"
    """Either way the learner stages each version in host memory (pinned on a GPU), never
    as a whole extra copy on its GPU. "object_store": the staging is put in Ray's object
    store by a learner thread while the next step trains; consumers load zero-copy views of
    it. "collective": the learner holds the staging and each consumer receives it on its
    own 2-rank torch.distributed group with the learner (NCCL between GPUs, gloo on CPUs)
    in buckets of `bucket_mb`, straight into its parameters. "auto": collective when the
    learner and every consumer (generator, rescorer, evaluator) have a GPU, else
    object_store."""
    timeout_s: float = 300.0
    """collective: a consumer's pair setup or one version's receive that takes longer fails
    its fetch (the stage's work then fails like any stage error)."""
    bucket_mb: int = 256
    """collective: a version moves from the learner's host staging to each consumer in
    buckets of this many MiB (double-buffered), so the learner's device holds at most two
    buckets for it, never a whole version."""

    def validate(self, path: str) -> None:
        one_of(f"{path}.transport", self.transport, ("auto", "object_store", "collective"))
        positive(f"{path}.timeout_s", self.timeout_s)
        positive(f"{path}.bucket_mb", self.bucket_mb)
