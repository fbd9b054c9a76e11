"""Driver: the process that runs a pipeline: one session, the assembly of stages, the loop.

session.py connects to Ray, creates or resumes the run directory, runs and cleans up; every
command that runs a pipeline (run, sweep, calibrate --short, study run) and the benches go
through it. assembly.py creates the stage actors and the runtime pieces a run needs;
controller.py is the loop that launches generation within the staleness bound, feeds the
learner and records each step.

May import: every folder but commands/. Imported by commands/ and the benches.
"""
