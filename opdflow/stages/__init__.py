"""Pipeline stages: generator pool, rescorer, teacher scorer, learner, evaluator.

Each stage's logic is a plain class that computes on its own device (compute/device.py)
and needs no Ray, so it runs in a script or a test as it runs in a pipeline; a thin actor
class beside it (a `StageActor`, actor.py) fetches the weights versions it is handed
(WeightsRef), records spans and, for the learner, leads its data-parallel peers. Each actor
is built from one frozen spec (specs.py: model, threads, engine and scoring settings),
and pins its torch threads at start so stages sharing a few cores do not fight. This file
holds no logic.

May import: opdflow.core, opdflow.config, opdflow.errors, opdflow.compute, opdflow.inputs,
opdflow.cluster (start-up), opdflow.record (spans, checkpoints), opdflow.weights,
opdflow.engines, opdflow.testbed; torch, and ray in the actor classes. Imported by driver/
and the benches.
"""
