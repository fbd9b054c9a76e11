"""Compute: the torch a stage computes with: its device, its math, its sharded student.

device.py decides where a stage's tensors live and measures its peak memory; scoring.py
scores tokens (chunked log-probabilities, entropies and exact KL of given responses) and
losses.py holds the learner's objectives, so the rescorer, teacher, learner, evaluator and
the measurement tools differ only by weights and precision, never by how they computed.
fsdp.py builds the learner's student as FSDP2 shards on the meta device and joins its
process group, bound to the node's interface (interfaces.py, which the weights pairs use
too).

May import: opdflow.core, opdflow.errors; torch and transformers. Imported by weights/,
memory/, stages/, analysis/ and the benches.
"""
