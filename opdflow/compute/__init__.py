"""Compute: the torch math every stage and analysis shares.

Token scoring (chunked log-probabilities, entropies and exact KL of given responses) and
the learner's objectives. The rescorer, teacher, learner, evaluator and the measurement
tools all score tokens through scoring.py, so their numbers differ only by weights and
precision, never by how they were computed.

May import: torch, numpy, opdflow.core, opdflow.errors. Imported by stages/, analysis/
and the benches.
"""
