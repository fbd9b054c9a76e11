"""Driver: the process that runs a pipeline: one session, the assembly of stages, the loop.

session.py connects to Ray, creates or resumes the run directory, runs and cleans up; every
command that runs a pipeline (run, sweep, calibrate --short, study run) and the benches go
through it. wiring.py reads a run's inputs once (models, prompts, tracker settings) and
holds the runtime one run is wired to (placement groups, trackers, checkpoints, profiler);
assembly.py creates the stage actors (each from its spec, stages/specs.py); controller.py is
the loop, one screen: launch within the staleness bound, wait for the batch, train,
publish, evaluate, checkpoint, record. Its parts live with the state they own: rollouts.py
holds the batches in flight (launched within the bound, awaited, dropped when they broke
it), recorder.py each step's metrics row, the run clock and the restarts; healing.py heals
the learner when a rank is lost (learner_group.py watches its ranks and places a new group),
rewinding the loop to the last checkpoint. sweep.py (a staleness
sweep) and ladder.py (calibrate --short's noise ladder) are batches of runs in one session.

May import: opdflow.core, opdflow.config, opdflow.errors, opdflow.inputs, opdflow.compute,
opdflow.cluster, opdflow.record, opdflow.weights, opdflow.engines, opdflow.stages,
opdflow.analysis, opdflow.testbed; ray. Imported by study/, commands/ and the benches.
"""
