"""Core: the rules of the pipeline as pure Python and numpy, with nothing heavy imported.

What lives here: the recipe grammar (the engine configuration c as text), the rollout batch
that flows through every stage, the staleness bound and the policies that choose k (fixed
and adaptive, made from a config or a sweep's k in policy.py), the launch rule the
controller and the simulator share (launch.py), how actors are named (actor_name.py), micro-batch planning by a token budget,
the mismatch estimators and the statistics the analyses share. No module here imports
torch, ray, vllm or transformers (a test says so), so the driver, the simulator and the
analyses can use the same rules without a GPU stack.

May import: opdflow.errors; numpy. Imported by every other folder.
"""
