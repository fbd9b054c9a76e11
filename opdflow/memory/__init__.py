"""Memory: the planned peak device memory of every GPU actor of a pipeline, before step 0.

plan.py holds the plan: each GPU actor's peak by part, checked against the actor's share of
a GPU, refusing with the actor, the part and the field to change. actors.py builds it stage
by stage (`plan_pipeline`): learner ranks (learner.py: parameters, gradients and optimizer
state as FSDP2 shards them, gathered parameters, activations per micro-batch with and
without activation checkpointing, weight publishing), vLLM engines (engine.py: weights per
tensor-parallel shard, runtime reserve, KV cache and its token capacity), the rescorer,
teacher and evaluator (weights and the prefill budget). trace.py measures the learner's
step and a prefill on fake tensors with torch's memory trackers (torch.distributed._tools),
so those numbers come from the real model, the learner's own FSDP2 wrapping and the
project's scoring code rather than a formula; vLLM, which cannot be traced here, is
computed. shape.py reads a model's shape (its config.json, or the published config of a
student the shipped pipelines name); gpus.py is a GPU's memory by its name (an instance or
accelerator type in a cluster file).

May import: opdflow.config, opdflow.core, opdflow.errors, opdflow.compute (FSDP wrapping,
scoring), opdflow.cluster (placement, cluster files), opdflow.weights (the transport),
opdflow.testbed (the cache directory); lazily torch and transformers. Imported by
commands/ (validate), the benches and tests.
"""
