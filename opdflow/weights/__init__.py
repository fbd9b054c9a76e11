"""Weights between stages: how each new version goes from the learner to its consumers.

Everything a version goes through lives here, so one folder is read to change it:
version.py (the flat buffer and manifest, the handle, the driver's WeightsRef),
transport.py (the Transport type `weights.transport` is parsed into once: ObjectStore and
Collective, each publishing, fetching, releasing and counting the bytes live), cast.py
(the learner's FP32 -> BF16 cast into staging, beside the next step), memory.py (where
buffers live: host staging, pinned on CUDA; bucket buffers on the wire device; the side
stream), publisher.py (the learner's side: staging, puts, held versions, sends and their
order with the learner's collectives), bucket.py (fixed-size buckets through two
buffers, and what a consumer does with them), pair.py (a consumer end's 2-rank group with
the learner), fetcher.py (a consumer's side), loader.py (the one copy into a model),
segment.py (a version shared with a vLLM engine's tensor-parallel worker processes) and
store.py (the driver's live versions and the k_max + 2 bound). docs/WEIGHTS.md explains
the design.

May import: opdflow.config, opdflow.errors, opdflow.compute (the node's interface for
pairs); numpy, and torch and ray lazily where a module needs no more. Imported by memory/,
engines/ (lazily), stages/, driver/ and the benches.
"""
